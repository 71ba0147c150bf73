"""The training plan: the arithmetic of a run (000_97c50ee16f84892d), printed and logged before the first step.

``plan_training`` is the pure arithmetic: batches per epoch, the last batch, optimizer steps with gradient
accumulation, devices and ``limit_train_batches``, which of ``max_epochs``/``max_steps`` ends the run, and how many
examples it sees. It reproduces the seed's worked examples (10,000 samples, batch 32, 3 epochs: 313 batches per
epoch, last batch 16, 939 steps; with accumulation 4: effective batch 128, 237 optimizer steps; 1,000 samples,
batch 64, 5 epochs: 16 per epoch, last batch 40, 80 steps) and what Lightning's loop does.

The ``TrainingPlan`` callback reads the real numbers from the trainer's train loader when training starts, prints
the table (rank 0), logs it as MLflow params ``plan.*`` and cross-checks it against
``trainer.num_training_batches`` and ``trainer.estimated_stepping_batches`` (the numbers the LR schedule is built
from), and at the end against the optimizer steps the loop really took. A disagreement is a loud warning: the plan
or the loop is wrong.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping
from typing import Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from datamodules.recipe_contract import batch_size_of
from lightning_modules.recipe_contract import schedule_of
from recipes.tracking.tracked_run import tracked_run
from recipes.callbacks.training_plan_figures import TrainingPlanFigures, parameter_phases

LIGHTNING_DEFAULT_MAX_EPOCHS = 1000  # what Trainer(max_epochs=None, max_steps=-1) trains for


class TrainingPlanWarning(UserWarning):
    """The plan and the trainer disagree: the plan's arithmetic or the training loop is wrong."""


def limited_batches(num_batches: int, limit_train_batches: int | float) -> int:
    """Batches Lightning runs per epoch under ``limit_train_batches`` (an int caps, a float is a fraction)."""
    if isinstance(limit_train_batches, bool):
        raise TypeError("limit_train_batches must be an int or a float")
    if isinstance(limit_train_batches, int):
        return min(num_batches, limit_train_batches)
    return int(num_batches * limit_train_batches)


def plan_training(
    train_samples: int,
    batch_size: int,
    max_epochs: int | None,
    max_steps: int = -1,
    accumulate_grad_batches: int = 1,
    world_size: int = 1,
    drop_last: bool = False,
    limit_train_batches: int | float = 1.0,
    warmup_steps: int = 0,
    batches_per_epoch: int | None = None,
) -> TrainingPlanFigures:
    """The arithmetic of a training run, as Lightning's loop carries it out.

    Per device: ``ceil(N / world_size)`` samples (``DistributedSampler`` pads the split), ``ceil(samples / B)``
    batches (``floor`` with ``drop_last``), then ``limit_train_batches``. Lightning steps the optimizer after every
    ``accumulate_grad_batches`` batches and at the end of the epoch even when the last window is incomplete, so
    optimizer steps per epoch are ``ceil(batches / accumulation)``. The run ends at ``max_epochs`` epochs or
    ``max_steps`` optimizer steps, whichever comes first; ``max_epochs=None`` means Lightning's default (1000
    epochs, or no epoch limit when ``max_steps`` is set).

    Args:
        train_samples: Samples in the train split (all devices together).
        batch_size: Samples per batch on one device.
        max_epochs: The trainer's ``max_epochs`` (-1: no limit; ``None``: Lightning's default).
        max_steps: The trainer's ``max_steps`` in optimizer steps (-1: no limit).
        accumulate_grad_batches: Batches whose gradients are summed before one optimizer step.
        world_size: Number of devices (processes) training together.
        drop_last: Whether the train loader drops the last incomplete batch.
        limit_train_batches: The trainer's ``limit_train_batches`` (int: batches, float: fraction of the epoch).
        warmup_steps: Optimizer steps of LR warmup (reported only).
        batches_per_epoch: Batches per epoch per device when a batch sampler decides them (overrides the division;
            the last batch size is then unknown).
    """
    if train_samples < 0:
        raise ValueError(f"plan_training: train_samples must be >= 0, got {train_samples}")
    if batch_size < 1:
        raise ValueError(f"plan_training: batch_size must be >= 1, got {batch_size}")
    if accumulate_grad_batches < 1:
        raise ValueError(f"plan_training: accumulate_grad_batches must be >= 1, got {accumulate_grad_batches}")
    if world_size < 1:
        raise ValueError(f"plan_training: world_size must be >= 1, got {world_size}")
    if max_steps < -1:
        raise ValueError(f"plan_training: max_steps must be >= -1, got {max_steps}")
    if max_epochs is None:
        max_epochs = -1 if max_steps != -1 else LIGHTNING_DEFAULT_MAX_EPOCHS
    if max_epochs < -1:
        raise ValueError(f"plan_training: max_epochs must be >= -1, got {max_epochs}")

    per_device = math.ceil(train_samples / world_size)
    full, remainder = divmod(per_device, batch_size)
    if batches_per_epoch is not None:
        all_batches = batches_per_epoch
        last: int | None = None
        dropped = 0
    elif drop_last:
        all_batches = full
        last = batch_size if full else 0
        dropped = remainder
    else:
        all_batches = full + (1 if remainder else 0)
        last = (remainder or batch_size) if per_device else 0
        dropped = 0
    batches = limited_batches(all_batches, limit_train_batches)
    if batches < all_batches and last is not None:
        last = batch_size if batches else 0  # the limited epoch ends before the partial batch
    if last is None:  # a batch sampler: every sample once per epoch, or only full batches with drop_last
        samples_per_epoch = per_device if not drop_last and batches == all_batches else batches * batch_size
    else:
        samples_per_epoch = (batches - 1) * batch_size + last if batches else 0
    steps_per_epoch = math.ceil(batches / accumulate_grad_batches)

    epoch_steps = None if max_epochs == -1 else steps_per_epoch * max_epochs
    if max_steps != -1 and (epoch_steps is None or max_steps < epoch_steps):
        total: int | None = max_steps
        bound_by: Literal["max_epochs", "max_steps", "unbounded"] = "max_steps"
    elif epoch_steps is None:
        total, bound_by = None, "unbounded"
    else:
        total, bound_by = epoch_steps, "max_epochs"

    if total is None or steps_per_epoch == 0:
        epochs = micro = seen = None
        if total is not None:  # no batches at all
            epochs, micro, seen = 0.0, 0, 0
    else:
        full_epochs, rest = divmod(total, steps_per_epoch)
        epochs = total / steps_per_epoch
        micro = full_epochs * batches + rest * accumulate_grad_batches
        seen = (full_epochs * samples_per_epoch + rest * accumulate_grad_batches * batch_size) * world_size

    return TrainingPlanFigures(
        train_samples=train_samples,
        batch_size=batch_size,
        devices=world_size,
        samples_per_device=per_device,
        batches_per_epoch=batches,
        last_batch_size=last,
        drop_last=drop_last,
        dropped_per_epoch=dropped,
        limit_train_batches=limit_train_batches,
        accumulate_grad_batches=accumulate_grad_batches,
        optimizer_steps_per_epoch=steps_per_epoch,
        max_epochs=max_epochs,
        max_steps=max_steps,
        total_optimizer_steps=total,
        bound_by=bound_by,
        epochs=epochs,
        effective_batch_size=batch_size * accumulate_grad_batches * world_size,
        warmup_steps=warmup_steps,
        micro_batches=micro,
        examples_seen=seen,
    )


def schedule_warmup_steps(pl_module: pl.LightningModule, total_steps: int | None) -> int:
    """Warmup of the module's ``schedule``: ``resolved_warmup_steps(total)`` (WarmupCosine), else 0."""
    schedule = schedule_of(pl_module)
    resolve = getattr(schedule, "resolved_warmup_steps", None)
    if callable(resolve) and total_steps is not None:
        return int(resolve(total_steps))
    return 0


def plan_from_trainer(trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[TrainingPlanFigures | None, str]:
    """The plan of the trainer's real train loader, or ``(None, why not)``."""
    loader = trainer.train_dataloader
    if not isinstance(loader, DataLoader):
        return None, f"the train loader is a {type(loader).__name__}, not one DataLoader"
    if isinstance(loader.dataset, IterableDataset):
        return stream_plan(trainer, pl_module, loader)
    try:
        dataset_size = len(loader.dataset)  # type: ignore[arg-type]
    except TypeError:
        return None, "the train dataset has no length (iterable dataset): only max_steps can bound the run"
    sampler = loader.sampler
    batches_override: int | None = None
    batch_size = loader.batch_size
    if batch_size is None:  # a batch sampler decides the batches
        batches_override = len(loader)
        batch_size = getattr(loader.batch_sampler, "batch_size", None) or batch_size_of(
            trainer.datamodule
        )
        if batch_size is None:
            return None, "the train loader's batch sampler has no batch_size"
    world_size = trainer.world_size
    if isinstance(sampler, DistributedSampler):
        # the draws of all ranks together, which each rank takes a ceil(N / world_size) shard of: the split for
        # Lightning's own DistributedSampler, ``num_samples`` for a ClassBalancedSampler
        train_samples = int(getattr(sampler, "total_draws", dataset_size))
    elif world_size == 1 and hasattr(sampler, "__len__"):
        train_samples = len(sampler)  # type: ignore[arg-type]  # a sampler may draw more or fewer samples
    else:
        train_samples = dataset_size
    args = dict(
        train_samples=train_samples,
        batch_size=int(batch_size),
        max_epochs=trainer.max_epochs,
        max_steps=trainer.max_steps,
        accumulate_grad_batches=trainer.accumulate_grad_batches,
        world_size=world_size,
        drop_last=bool(loader.drop_last),
        limit_train_batches=trainer.limit_train_batches,
        batches_per_epoch=batches_override,
    )
    figures = plan_training(**args)  # type: ignore[arg-type]
    warmup = schedule_warmup_steps(pl_module, figures.total_optimizer_steps)
    return dataclasses.replace(figures, warmup_steps=warmup, parameter_phases=parameter_phases(pl_module)), ""


class TrainingPlan(Callback):
    """Print and log the training plan when training starts; check it against what the loop does.

    At ``on_train_start`` (train loader loaded, after the sanity check) the callback builds the plan from the real
    loader (``plan_from_trainer``), prints the table on rank 0, and logs the figures as MLflow params ``plan.*``
    (params already in the run, e.g. on resume, are not logged again). It compares the plan with
    ``trainer.num_training_batches`` and ``trainer.estimated_stepping_batches``, and at ``on_train_end`` with the
    optimizer steps the loop took (unless a callback stopped the run early); a disagreement is a
    ``TrainingPlanWarning`` and is kept in ``mismatches``.

    Args:
        print_table: Print the table on rank 0.
        log_params: Log the figures as MLflow params ``plan.*`` when an MLflow logger is attached.
    """

    def __init__(self, print_table: bool = True, log_params: bool = True) -> None:
        self.print_table = print_table
        self.log_params = log_params
        self.figures: TrainingPlanFigures | None = None
        self.table = ""
        self.mismatches: list[str] = []
        self.observed_optimizer_steps: int | None = None
        self._start_step = 0

    def _warn(self, trainer: pl.Trainer, message: str) -> None:
        self.mismatches.append(message)
        if trainer.is_global_zero:
            warnings.warn(f"TrainingPlan: {message}", TrainingPlanWarning, stacklevel=2)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.mismatches = []
        self.observed_optimizer_steps = None
        self._start_step = trainer.global_step
        figures, why = plan_from_trainer(trainer, pl_module)
        self.figures = figures
        if figures is None:
            self.table = f"Training plan: not available ({why})"
            if self.print_table and trainer.is_global_zero:
                print(self.table, flush=True)
            return
        table = figures.table()
        if self._start_step:
            table += f"\n  resuming at optimizer step {self._start_step:,}"
        self.table = table
        if self.print_table and trainer.is_global_zero:
            print(table, flush=True)
        if figures.batches_per_epoch != trainer.num_training_batches:
            self._warn(
                trainer,
                f"the plan has {figures.batches_per_epoch} batches per epoch but the trainer runs "
                f"{trainer.num_training_batches}",
            )
        estimated = trainer.estimated_stepping_batches
        planned = math.inf if figures.total_optimizer_steps is None else figures.total_optimizer_steps
        if estimated != planned:
            self._warn(
                trainer,
                f"the plan has {planned} optimizer steps but trainer.estimated_stepping_batches is {estimated} "
                "(the number LR schedules are built from): the plan or the loop is wrong",
            )
        if self.log_params:
            self._log_params(trainer, figures)

    def _log_params(self, trainer: pl.Trainer, figures: TrainingPlanFigures) -> None:
        run = tracked_run(trainer)
        if run is None or not trainer.is_global_zero:
            return
        changed = run.log_params_once(figures.as_params())
        if changed:
            shown = ", ".join(f"{k}: run has {old}, now {new}" for k, (old, new) in sorted(changed.items()))
            self._warn(trainer, f"this run already logged a different plan (resumed with other settings?): {shown}")

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        figures = self.figures
        self.observed_optimizer_steps = trainer.global_step - self._start_step
        if figures is None or figures.total_optimizer_steps is None or trainer.should_stop:
            return  # no plan, no end, or a callback (early stopping, max_time) ended the run on purpose
        expected = figures.total_optimizer_steps - self._start_step
        if self.observed_optimizer_steps != expected:
            self._warn(
                trainer,
                f"the loop took {self.observed_optimizer_steps} optimizer steps but the plan said {expected}",
            )


__all__ = [
    "TrainingPlan",
    "TrainingPlanFigures",
    "TrainingPlanWarning",
    "limited_batches",
    "plan_from_trainer",
    "plan_training",
    "schedule_warmup_steps",
]


def stream_plan(trainer: pl.Trainer, pl_module: pl.LightningModule,
                loader: DataLoader) -> tuple[TrainingPlanFigures | None, str]:
    """The plan of a streamed train split (an iterable dataset of whole batches, ``StreamingTableDataModule``): its
    rows from the data module's ``split_sizes``, full batches only (the remainder is left out), the loader's length
    as the batches per epoch and device."""
    sizes = getattr(trainer.datamodule, "split_sizes", None)
    batch_size = batch_size_of(trainer.datamodule)
    try:
        batches = len(loader)
    except TypeError:
        batches = None
    if not isinstance(sizes, Mapping) or "train" not in sizes or batch_size is None or batches is None:
        return None, "the train dataset is iterable without split_sizes, batch_size and a length: only max_steps can bound the run"
    args = dict(train_samples=int(sizes["train"]), batch_size=int(batch_size), max_epochs=trainer.max_epochs,
                max_steps=trainer.max_steps, accumulate_grad_batches=trainer.accumulate_grad_batches,
                world_size=trainer.world_size, drop_last=True, limit_train_batches=trainer.limit_train_batches)
    figures = plan_training(**args)  # type: ignore[arg-type]
    if figures.batches_per_epoch != batches:  # the stream's own share of rows decides
        figures = plan_training(**args, batches_per_epoch=batches)  # type: ignore[arg-type]
    warmup = schedule_warmup_steps(pl_module, figures.total_optimizer_steps)
    return dataclasses.replace(figures, warmup_steps=warmup, parameter_phases=parameter_phases(pl_module)), ""
