"""The ``schedule`` check: LR schedules configured so that they cannot do what they were built for.

002: a per-step schedule stepped per epoch moves the LR ``len(loader)`` times too slowly; that is an error before
training starts. So is a ``ReduceLROnPlateau`` whose monitor is never logged: with validation disabled, before
training; otherwise at the end of the first epoch with a validation, before Lightning steps the scheduler.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR

from lightning_modules.recipe_contract import configured_schedule_of
from recipes.doctor.base import DoctorCheck
from recipes.doctor.findings import FindingsReporter

# attributes of torch schedulers that hold their length; equal to the run's optimizer steps means "sized in steps"
LENGTH_ATTRIBUTES = ("T_max", "total_iters", "total_steps", "T_0")


class ScheduleError(ValueError):
    """The LR schedule is configured so that it cannot do what it was built for."""


def configured_schedule(pl_module: pl.LightningModule) -> Any:
    """The module's description of its LR scheduler (``Task.configured_schedule()``), ``None`` for other modules."""
    return configured_schedule_of(pl_module)


def per_step_reason(trainer: pl.Trainer, scheduler: Any, schedule: Any) -> str | None:
    """Why ``scheduler`` must be stepped per optimizer step, or ``None`` when nothing says so.

    ``schedule`` is the module's description of the scheduler (a ``Schedule`` with an ``interval``) or ``None``.
    """
    name = type(scheduler).__name__
    if isinstance(scheduler, (OneCycleLR, CyclicLR)):
        return f"{name} is a per-step schedule"
    if schedule is not None and getattr(schedule, "interval", None) == "step":
        return f"the task's schedule {type(schedule).__name__} is a per-step schedule ({name})"
    for attribute in LENGTH_ATTRIBUTES:
        length = getattr(scheduler, attribute, None)
        if not isinstance(length, int) or length <= 1:
            continue
        total = trainer.estimated_stepping_batches
        max_epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
        if math.isfinite(total) and length == int(total) and (max_epochs is None or length > max_epochs):
            return f"{name} is sized in optimizer steps ({attribute}={length}, the run's optimizer steps)"
    return None


class ScheduleCheck(DoctorCheck):
    """Fail before training on a per-step LR schedule stepped per epoch, and after the first validation on a plateau
    schedule whose monitored metric is never logged (``ScheduleError``, tag ``doctor.failure``).

    Args:
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.
    """

    name = "schedule"

    def __init__(self, reporter: FindingsReporter | None = None) -> None:
        super().__init__(reporter)

    def reset(self) -> None:
        self._plateau_monitors: list[tuple[str, str]] = []  # (scheduler, monitor) to check after a validation
        self._validated_this_epoch = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        schedule = configured_schedule(pl_module)
        for config in trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            name = type(scheduler).__name__
            if config.reduce_on_plateau:
                monitor = str(config.monitor)
                if not is_overridden("validation_step", pl_module):
                    no_validation = "the module has no validation_step"
                elif trainer.limit_val_batches == 0:
                    no_validation = "limit_val_batches=0"
                else:
                    no_validation = ""
                if no_validation and not monitor.startswith("train"):
                    self.reporter.fail(
                        trainer,
                        self.name,
                        ScheduleError,
                        f"{name} monitors {monitor!r} but validation never runs ({no_validation}): the LR would "
                        "never change. Enable validation or use a schedule that does not need a metric.",
                    )
                self._plateau_monitors.append((name, monitor))
                continue
            if config.interval != "epoch":
                continue
            reason = per_step_reason(trainer, scheduler, schedule)
            if reason:
                trainer.estimated_stepping_batches  # loads the train loader if the module has not asked yet
                batches = trainer.num_training_batches
                slower = "many times"
                if math.isfinite(batches) and batches > 0:
                    slower = f"{math.ceil(batches / trainer.accumulate_grad_batches)}x"
                self.reporter.fail(
                    trainer,
                    self.name,
                    ScheduleError,
                    f"{reason}, but it is stepped once per epoch (lr_scheduler interval='epoch', Lightning's "
                    f"default): the LR would move {slower} too slowly and never finish its schedule. Return "
                    "{'scheduler': ..., 'interval': 'step'} as the lr_scheduler config.",
                )

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._validated_this_epoch = False

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated_this_epoch = True

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._validated_this_epoch and self._plateau_monitors:
            self._check_plateau_monitors(trainer)

    def _check_plateau_monitors(self, trainer: pl.Trainer) -> None:
        for name, monitor in self._plateau_monitors:
            if monitor not in trainer.callback_metrics:
                available = ", ".join(sorted(trainer.callback_metrics)) or "none"
                self.reporter.fail(
                    trainer,
                    self.name,
                    ScheduleError,
                    f"{name} monitors {monitor!r}, which is never logged (after a validation the logged metrics "
                    f"are: {available}): the LR would never change. Set the schedule's monitor to one of them.",
                )
        self._plateau_monitors = []  # checked once: a metric logged once stays in callback_metrics


__all__ = ["LENGTH_ATTRIBUTES", "ScheduleCheck", "ScheduleError", "configured_schedule", "per_step_reason"]
