"""What a task needs to know about a batch: its inputs and targets, its size, its images in channels-last format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor


def split_batch(batch: Any) -> tuple[Any, Tensor | None]:
    """Split a batch into (inputs, targets).

    Accepts ``(inputs, targets)`` tuples/lists, a bare input tensor (prediction), or a dict with a ``labels`` key
    whose other keys are passed to the network as keyword arguments.
    """
    if isinstance(batch, Mapping):
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return inputs, batch.get("labels")
    if isinstance(batch, (tuple, list)):
        if len(batch) == 2:
            return batch[0], batch[1]
        if len(batch) == 1:
            return batch[0], None
        raise ValueError(f"expected a batch of (inputs, targets), got a sequence of {len(batch)} items")
    return batch, None


def to_channels_last(batch: Any) -> Any:
    """4-D floating-point tensors of a batch (tensor, tuple/list or dict) in channels-last format; the rest as is."""
    if isinstance(batch, Tensor):
        if batch.ndim == 4 and batch.is_floating_point():
            return batch.contiguous(memory_format=torch.channels_last)
        return batch
    if isinstance(batch, Mapping):
        return type(batch)({k: to_channels_last(v) for k, v in batch.items()}) if isinstance(batch, dict) else batch
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return tuple(to_channels_last(v) for v in batch)
    if isinstance(batch, list):
        return [to_channels_last(v) for v in batch]
    return batch


def batch_length(inputs: Any) -> int:
    """Number of samples in a batch of inputs (tensor or dict of tensors)."""
    if isinstance(inputs, Mapping):
        inputs = next(iter(inputs.values()))
    return int(inputs.shape[0])


__all__ = ["batch_length", "split_batch", "to_channels_last"]
