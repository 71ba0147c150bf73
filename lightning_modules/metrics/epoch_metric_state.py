"""The partial epoch's training metrics, kept in a checkpoint so that a resumed epoch's metrics cover all its batches.

torchmetrics keeps a metric's state out of ``state_dict`` (its states are not ``persistent``), and Lightning resets the
metrics it logs at each epoch's end, so a checkpoint written in the middle of an epoch (``--checkpoint_every_n_steps``,
SIGTERM) used to lose the batches trained so far: the resumed epoch's ``train/acc`` covered only the batches after the
resume. The state travels under its own checkpoint key (``TRAIN_METRIC_STATE``), not in ``state_dict``, so the
weights a checkpoint holds, and loading them anywhere else, stay as they were.

- Saving first applies the updates still waiting on the device (``DeferredMetricUpdates.flush``: every loopwise
  metric is a sum over samples, so applying them now or later gives the same state).
- Under DDP each process holds its own part: the states are added over the processes (torchmetrics' ``sync_context``,
  every state's own reduction) and process 0 restores the sum, the others start from zero; the sum over the
  processes at the epoch's end is then that of the uninterrupted run.
- Restored states replace the metrics' states (torchmetrics' ``load_state_dict``, which takes a state by name whether
  or not it is persistent), on the device of the metric.
- An epoch-end checkpoint is written before Lightning logs the epoch's train metrics (ModelCheckpoint saves in the
  epoch's end hooks, Lightning logs after them): after a ``kill -9`` between the two, the resumed run starts the next
  epoch with that finished epoch's state restored, and ``start_train_epoch`` logs its values at the step Lightning
  would have (the checkpoint's step - 1) before resetting them. A logger that already holds them skips them
  (``RecipeLogger`` of a continued run writes no step its history holds).
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch
from torch import Tensor
from torchmetrics import MetricCollection

from lightning_modules.metrics.deferred_metric_updates import DeferredMetricUpdates

#: the checkpoint key of the training metrics' state
TRAIN_METRIC_STATE = "loopwise_train_metric_state"

# metrics restored from a checkpoint -> that checkpoint's global step; at the next epoch start with no step trained
# since, the restored state is a finished epoch's (a mid-epoch resume trains steps before its next epoch start)
_RESTORED_AT: weakref.WeakKeyDictionary[MetricCollection, int] = weakref.WeakKeyDictionary()


def _detached(value: Tensor | list[Tensor]) -> Tensor | list[Tensor]:
    if isinstance(value, Tensor):
        return value.detach().clone()
    return [item.detach().clone() for item in value]


def epoch_metric_state(metrics: MetricCollection, updates: DeferredMetricUpdates) -> dict[str, dict[str, Any]]:
    """Every metric's state (metric name -> state name -> tensor or list of tensors), the waiting updates applied
    first, added over the processes under DDP (every process must call this, as every process saves a checkpoint)."""
    updates.flush()
    saved: dict[str, dict[str, Any]] = {}
    for name, metric in metrics.items(keep_base=True, copy_state=False):
        with metric.sync_context(should_sync=True, should_unsync=True):
            saved[name] = {state: _detached(value) for state, value in metric.metric_state.items()}
    return saved


def restore_epoch_metric_state(
    metrics: MetricCollection, saved: dict[str, dict[str, Any]], rank: int = 0, step: int | None = None
) -> None:
    """Put ``saved`` (from ``epoch_metric_state``) back into ``metrics``: on process 0 the saved sums, on every other
    process the metrics reset (their share is in process 0's sums). Metrics or states that ``saved`` does not name
    are reset (a checkpoint of another task's version). ``step``: the checkpoint's global step (for
    ``start_train_epoch``)."""
    metrics.reset()
    if step is not None:
        _RESTORED_AT[metrics] = int(step)
    if rank != 0:
        return
    for name, metric in metrics.items(keep_base=True, copy_state=False):
        states = saved.get(name)
        if not states:
            continue
        current = metric.metric_state
        moved = {
            state: _on_device_of(value, current[state]) for state, value in states.items() if state in current
        }
        metric.load_state_dict(moved, strict=False)


def start_train_epoch(metrics: MetricCollection, loggers: list[Any], step: int) -> None:
    """An epoch starts at global step ``step``: the train metrics are reset. When they hold the state restored from
    a checkpoint of this same step (an epoch-end checkpoint: no step trained since), that finished epoch's values
    are written to ``loggers`` first, at step ``step - 1`` as Lightning writes an epoch's values. Every process
    calls it (the values are added over the processes; Lightning's loggers write from process 0 only)."""
    restored_at = _RESTORED_AT.pop(metrics, None)
    if restored_at is not None and restored_at == step > 0:
        with warnings.catch_warnings():  # a state loaded, not updated: torchmetrics warns that compute comes first
            warnings.filterwarnings("ignore", message=".*compute.*before the.*update.*")
            values = {name: float(value) for name, value in metrics.compute().items()}
        for logger in loggers:
            logger.log_metrics(values, step=step - 1)
    metrics.reset()


def _on_device_of(value: Tensor | list[Tensor], like: Tensor | list[Tensor]) -> Tensor | list[Tensor]:
    device = like.device if isinstance(like, Tensor) else torch.device("cpu")
    if isinstance(value, Tensor):
        return value.to(device)
    return [item.to(device) for item in value]


__all__ = ["TRAIN_METRIC_STATE", "epoch_metric_state", "restore_epoch_metric_state", "start_train_epoch"]
