"""The ReduceLROnPlateau step missing from epoch-end checkpoints written before the task took that step itself.

Lightning steps plateau schedulers at the very end of an epoch (``FitLoop.on_advance_end``), after validation, so a
checkpoint written after validation held the scheduler *before* that epoch's step, and a run resumed from it never took
that step. ``Task`` now takes the step when the epoch's validation ends, before its checkpoints are written
(``lightning_modules/optim/plateau_step.py``), so a new checkpoint already holds it. ``PlateauStepOnResume`` still keeps
the monitored values in every checkpoint and, when a run resumes from a checkpoint whose scheduler is behind the epochs
it counts as finished (one written before that change, or by a task that leaves the step to Lightning), takes the
missing step with the stored value. A scheduler that is not behind is left alone, so no step is ever taken twice.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_modules.optim.plateau_step import plateau_steps_due
from lightning_modules.read_steps import epoch_batches_done


def _epoch_end_pending(trainer: pl.Trainer) -> bool:
    """Whether the epoch's batches are done but the fit loop has not finished the epoch (so the plateau step of this
    epoch has not been taken): the state of a checkpoint written during end-of-epoch validation."""
    fit_loop = trainer.fit_loop
    progress = fit_loop.epoch_progress.current
    if progress.completed >= progress.ready:  # FitLoop.on_advance_end has finished: the step is taken
        return False
    return epoch_batches_done(trainer)


class PlateauStepOnResume(Callback):
    """Store the metrics that plateau schedulers monitor in every checkpoint; on resume from a checkpoint written
    before the epoch's plateau step, take that step with the stored values (as the uninterrupted run did).

    Works with a plain ``lightning.Trainer`` too; does nothing for runs without a ``ReduceLROnPlateau``.
    """

    def __init__(self) -> None:
        self._pending: dict[str, float] | None = None

    def state_dict(self) -> dict[str, Any]:
        trainer = getattr(self, "_trainer", None)
        if trainer is None or not trainer.lr_scheduler_configs:
            return {"pending": False, "metrics": {}}
        monitors = {c.monitor for c in trainer.lr_scheduler_configs if c.reduce_on_plateau and c.monitor}
        metrics = {
            name: float(value)
            for name, value in trainer.callback_metrics.items()
            if name in monitors
            and isinstance(value, (torch.Tensor, float, int))
            and torch.as_tensor(value).numel() == 1
        }
        pending = _epoch_end_pending(trainer) and bool(monitors)
        return {"pending": pending, "epoch": int(trainer.current_epoch), "metrics": metrics}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # only called when fit resumes from a checkpoint
        self._pending = dict(state_dict) if state_dict.get("pending") else None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pending, self._pending = self._pending, None
        if pending is None or not pl_module.automatic_optimization:
            return
        # Lightning (2.6) counts the checkpoint's epoch as finished whether or not it re-runs its end, and takes its
        # plateau step in neither case: take it here, as FitLoop.on_advance_end would have
        epoch = int(pending.get("epoch", trainer.current_epoch))
        for config in trainer.lr_scheduler_configs:
            if not config.reduce_on_plateau or config.interval != "epoch" or (epoch + 1) % config.frequency:
                continue
            if config.scheduler.last_epoch >= plateau_steps_due(epoch, config.frequency):
                continue  # the checkpoint holds the step already (PlateauStep)
            value = pending["metrics"].get(config.monitor)
            if value is None:
                continue
            pl_module.lr_scheduler_step(config.scheduler, torch.tensor(value))


__all__ = ["PlateauStepOnResume"]
