"""Where a training epoch stands, from Lightning's public loop state: whether its values are read after this step.

A training step reads nothing back from the device (``Task``): the train metrics' inputs are kept on the device and
applied where their epoch values are read: the epoch's last batch (the epoch line, epoch metrics and the validation
that follows read them), a run that is stopping, and the run's last step. Validation and test keep theirs until the
last batch of each dataloader.
"""

from __future__ import annotations

from typing import Any


def epoch_batches_done(trainer: Any) -> bool:
    """Whether the fit loop has fetched ("readied") every batch of the current epoch: true from the
    ``on_train_batch_start`` of the epoch's last batch on, through its end-of-epoch validation (the fit loop's public
    ``batch_progress`` against ``trainer.num_training_batches``)."""
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return progress.current.ready == trainer.num_training_batches or bool(progress.is_last_batch)


def ends_epoch_values(trainer: Any) -> bool:
    """Whether the training batch in progress is the last before the epoch's values are read: the epoch's last batch,
    a stopping run or the run's last step."""
    if epoch_batches_done(trainer) or trainer.should_stop:
        return True
    return 0 <= trainer.max_steps <= trainer.global_step + 1


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


__all__ = ["ends_epoch_values", "epoch_batches_done", "is_last_evaluation_batch", "train_metrics_read_now"]
