"""Which training steps have their values read back to the host.

A training step reads nothing back from the device (``Task``, the loop doctor): the values of the steps in between
are kept on the device and read at these steps, which is where a per-step read would have been seen anyway: the
steps whose values Lightning writes to the loggers (every ``log_every_n_steps``), the epoch's last batch (the epoch
line, epoch metrics and the validation that follows read them), a run that is stopping, and the run's last step.
The training metrics are epoch values: their kept updates are applied only at the last three.
"""

from __future__ import annotations

from typing import Any

from lightning_modules.compat import epoch_batches_done, is_logging_step


def is_read_step(trainer: Any) -> bool:
    """Whether the training batch in progress is a step whose values are read back: a logging step, the epoch's last
    batch, a stopping run or the run's last step. The same answer from ``on_train_batch_start`` to the optimizer
    step of that batch."""
    return is_logging_step(trainer) or ends_epoch_values(trainer)


def ends_epoch_values(trainer: Any) -> bool:
    """Whether the training batch in progress is the last before the epoch's values are read: the epoch's last batch,
    a stopping run or the run's last step (a logging step reads step values only)."""
    if epoch_batches_done(trainer) or trainer.should_stop:
        return True
    return 0 <= trainer.max_steps <= trainer.global_step + 1


def train_values_read_now(trainer: Any) -> bool:
    """Whether a training step's values are read: Lightning writes step values to the loggers (a logging step), or
    the epoch or the run ends after it (the epoch line, callbacks and loggers read the epoch's metrics then). Always
    true without a trainer or outside its fit loop."""
    return trainer is None or not trainer.training or is_read_step(trainer)


def train_metrics_read_now(trainer: Any) -> bool:
    """Whether the training metrics (epoch-level values) are read after this training step: the epoch or the run ends
    after it (``ends_epoch_values``). Always true without a trainer or outside its fit loop."""
    return trainer is None or not trainer.training or ends_epoch_values(trainer)


def is_last_evaluation_batch(trainer: Any, batch_idx: int | None) -> bool:
    """Whether ``batch_idx`` is the last batch of a validation or test dataloader, where an evaluation's values are
    read (always true without a trainer or a batch index: the epoch-end hooks read them then)."""
    if trainer is None or batch_idx is None:
        return True
    counts = trainer.num_test_batches if trainer.testing else trainer.num_val_batches
    return any(batch_idx + 1 == count for count in counts)


__all__ = ["ends_epoch_values", "is_last_evaluation_batch", "is_read_step", "train_metrics_read_now", "train_values_read_now"]
