"""Where a ``ReduceLROnPlateau`` step lives: at the end of the epoch's validation, before that validation's checkpoints.

Lightning (2.6) steps plateau schedulers at the very end of an epoch (``FitLoop.on_advance_end``): after the epoch's
validation and the checkpoints written there, so an epoch-end checkpoint held the scheduler *before* its epoch's step;
and not at all at the end of an epoch that a run resumed in the middle of (the fit loop is "restarting" then, and
Lightning skips plateau schedulers because their metric is not in the checkpoint). A resumed run's scheduler was then
one step behind (``last_epoch``, ``best``, ``num_bad_epochs``): it lowered the LR an epoch later, and early stopping
landed elsewhere.

``PlateauStep`` takes the step when the epoch's end-of-epoch validation ends (``on_validation_end``; Lightning runs
checkpoint callbacks after every other callback), with the value that validation produced. Every checkpoint then
holds the scheduler as the uninterrupted run has it at that point: a mid-epoch checkpoint holds the steps of the
epochs before, an epoch-end one the step of its epoch too. ``plateau_step_taken`` makes Lightning's own call at the
epoch's end a no-op when the step is taken (the task's ``lr_scheduler_step`` asks it), and leaves Lightning's call
in place where no validation ended the epoch (``val_check_interval`` that does not end on the epoch's last batch).

The steps due by the end of epoch ``e`` are ``(e + 1) // frequency`` (Lightning steps at every ``frequency``-th epoch;
``Task`` sets it to ``check_val_every_n_epoch``), and ``ReduceLROnPlateau.last_epoch`` counts the steps taken, so
whether an epoch's step is taken is read from the scheduler itself, which every checkpoint holds.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch.optim.lr_scheduler import ReduceLROnPlateau

from lightning_modules.read_steps import epoch_batches_done


def _epoch_config(trainer: Any, scheduler: Any) -> Any | None:
    """The trainer's epoch-interval scheduler config of ``scheduler`` when it is a ``ReduceLROnPlateau``."""
    if not isinstance(scheduler, ReduceLROnPlateau):
        return None
    for config in trainer.lr_scheduler_configs:
        if config.scheduler is scheduler and config.interval == "epoch":
            return config
    return None


def plateau_steps_due(epoch: int, frequency: int) -> int:
    """How many steps a plateau scheduler stepped every ``frequency`` epochs has taken by the end of ``epoch``."""
    return (epoch + 1) // max(1, frequency)


def plateau_step_taken(trainer: Any, scheduler: Any) -> bool:
    """Whether ``scheduler`` is an epoch-interval ``ReduceLROnPlateau`` that has already taken the current epoch's
    step (``PlateauStep``): Lightning's own call at the epoch's end must then do nothing."""
    config = _epoch_config(trainer, scheduler) if trainer is not None else None
    if config is None:
        return False
    return scheduler.last_epoch >= plateau_steps_due(trainer.current_epoch, config.frequency)


class PlateauStep(Callback):
    """Step the epoch-interval ``ReduceLROnPlateau`` schedulers when the epoch's last validation ends, before the
    checkpoints of that validation are written (see the module docstring). Does nothing without one, in a sanity
    check, in a validation that does not end the epoch's batches, or when the monitored value is missing (Lightning's
    step at the epoch's end then reports it, as before)."""

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or not pl_module.automatic_optimization:
            return
        if not epoch_batches_done(trainer):
            return
        for config in trainer.lr_scheduler_configs:
            if _epoch_config(trainer, config.scheduler) is None or not config.monitor:
                continue
            if (trainer.current_epoch + 1) % max(1, config.frequency):
                continue
            value = trainer.callback_metrics.get(config.monitor)
            if value is None or plateau_step_taken(trainer, config.scheduler):
                continue
            pl_module.lr_scheduler_step(config.scheduler, value)


__all__ = ["PlateauStep", "plateau_step_taken", "plateau_steps_due"]
