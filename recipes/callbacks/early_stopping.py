"""Early stopping that says why it stopped: one line on stderr and the tag ``loopwise.early_stopping``.

``RecipeEarlyStopping`` is Lightning's ``EarlyStopping``, unchanged in what it decides. Around each of its checks it
notes, from the callback's public state, whether the monitored value improved (then the epoch of the best value) and
whether the check told the trainer to stop. When training ends because of such a check, rank 0 prints one line
(wrapped here) ::

    recipes: early stopping at epoch 23: val/loss has not improved for 8 validations (best 0.2131 at epoch 15,
    patience 8)

and the same reason (without ``recipes:``) becomes the MLflow run's tag ``loopwise.early_stopping``. Epochs count
from 1, as the ``epoch N/M`` lines of ``recipes.callbacks.epoch_summary`` do. The epoch of the best value is part of the callback's
checkpoint state, so a resumed run names the same epoch an uninterrupted one would.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import EarlyStopping
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason

from recipes.tracking.tracked_run import tracked_run

TAG = "loopwise.early_stopping"
Hook = Callable[[pl.Trainer, pl.LightningModule], None]


class RecipeEarlyStopping(EarlyStopping):
    """Lightning's ``EarlyStopping`` that reports, once, why it stopped training (stderr line and MLflow tag).

    Takes ``EarlyStopping``'s arguments. ``best_epoch`` is the epoch (from 1) of ``best_score``, ``None`` before the
    first improvement; ``reason`` is the reason of the check that stopped this fit, ``None`` while none has.
    """

    def __init__(self, monitor: str, **kwargs: Any) -> None:
        super().__init__(monitor=monitor, **kwargs)
        self.best_epoch: int | None = None
        self.reason: str | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A new fit has no stopping reason yet (a resumed one keeps ``best_epoch`` from its checkpoint). A fit resumed
        from a checkpoint written after this callback stopped training (a kill -9 during the model logging or the
        final status write) stops again before its first step, as the uninterrupted run trained no further (before,
        Lightning went on with the next epoch)."""
        self.reason = None
        if self.stopping_reason != EarlyStoppingReason.NOT_STOPPED:
            trainer.should_stop = True
            self.reason = self.describe(self.stopped_epoch + 1)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's check (when it runs here), then what it decided."""
        self._observe_check(trainer, pl_module, super().on_train_epoch_end)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's check (when it runs here), then what it decided."""
        self._observe_check(trainer, pl_module, super().on_validation_end)

    def _observe_check(self, trainer: pl.Trainer, pl_module: pl.LightningModule, check: Hook) -> None:
        # EarlyStopping assigns a new best_score only when the value improved, and a new stopping_reason_message only
        # when the check stops training: clearing the message first tells this check's decision from an earlier one's.
        best_before = self.best_score
        earlier_message = self.stopping_reason_message
        self.stopping_reason_message = None
        check(trainer, pl_module)
        epoch = trainer.current_epoch + 1
        if self.best_score is not best_before:
            self.best_epoch = epoch
        if self.stopping_reason_message is None:
            self.stopping_reason_message = earlier_message
        else:
            self.reason = self.describe(epoch, trainer.callback_metrics.get(self.monitor))

    def describe(self, epoch: int, current: Any = None) -> str:
        """The reason for stopping at ``epoch`` (from 1), as printed and tagged (``current``: the value just seen)."""
        if self.stopping_reason == EarlyStoppingReason.PATIENCE_EXHAUSTED:
            why = f"{self.monitor} has not improved for {self.wait_count} validations"
        elif self.stopping_reason == EarlyStoppingReason.NON_FINITE_METRIC and current is not None:
            why = f"{self.monitor} is {float(current)}"
        else:
            why = self.stopping_reason_message or "the monitored metric said stop"
        best = float(self.best_score)
        if self.best_epoch is None or not math.isfinite(best):
            best_part = "no best value yet"
        else:
            best_part = f"best {best:.4g} at epoch {self.best_epoch}"
        return f"early stopping at epoch {epoch}: {why} ({best_part}, patience {self.patience})"

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Say why training stopped, when a check of this fit stopped it: stderr line and run tag, rank 0 only."""
        if self.reason is None or not trainer.is_global_zero:
            return
        print(f"recipes: {self.reason}", file=sys.stderr, flush=True)
        run = tracked_run(trainer)
        if run is not None:
            run.set_tag(TAG, self.reason)

    def state_dict(self) -> dict[str, Any]:
        """``EarlyStopping``'s state and the epoch of the best value."""
        return {**super().state_dict(), "best_epoch": self.best_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """``EarlyStopping``'s state and the epoch of the best value (``None`` from a checkpoint without it)."""
        super().load_state_dict(state_dict)
        self.best_epoch = state_dict.get("best_epoch")


__all__ = ["TAG", "RecipeEarlyStopping"]
