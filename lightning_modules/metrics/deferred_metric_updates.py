"""Metric updates gathered on the device and applied a few batches at a time.

A torchmetrics ``update`` costs a fixed amount of Python and kernel launches per call, about as much as a small
network's whole training step, and some metrics read a value back to the host inside it (``torch.bincount`` on
CUDA, torchmetrics' argument checks). ``DeferredMetricUpdates`` keeps each batch's (outputs, targets) as they are,
on the device, and hands them to the metrics concatenated, in one update, when somebody is about to read the metrics
(a logging step, the end of an epoch or of the run) or when the kept tensors grow past ``max_elements``.

Every loopwise metric is a sum over samples (stat scores, squared and absolute errors, R² sums, log-probabilities
and counts), so one update with the concatenated rows gives exactly the state of one update per step. The updates
run inside ``native_bincount``: torchmetrics then counts classes with ``torch.bincount`` under ``deterministic: true``
too, not with a comparison of every sample with every bin.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lightning_modules.metrics.native_bincount import native_bincount


class DeferredMetricUpdates:
    """(outputs, targets) of the batches since the last ``flush``, handed to ``update`` in one call.

    Args:
        update: Updates the metrics with concatenated (outputs, targets) of one or more batches (e.g. logits turned
            into probabilities, then ``MetricCollection.update``); called once per flush, not once per batch.
        max_elements: Flush on ``add`` once the kept outputs and targets hold more elements than this (bounds the
            device memory they take: 2**24 float32 elements are 64 MiB).

    Batches whose outputs differ in shape beyond the batch dimension (length-bucketed sequences) are concatenated in
    runs of equal shape, one update per run.
    """

    def __init__(
        self,
        update: Callable[[Tensor, Tensor], None],
        max_elements: int = 2**24,
    ) -> None:
        self.update = update
        self.max_elements = max_elements
        self.outputs: list[Tensor] = []
        self.targets: list[Tensor] = []
        self.elements = 0

    def __len__(self) -> int:
        return len(self.outputs)

    def add(self, outputs: Tensor, targets: Tensor) -> None:
        """Keep one batch's (detached) outputs and targets; flush when they grow past ``max_elements``."""
        self.outputs.append(outputs.detach())
        self.targets.append(targets.detach())
        self.elements += outputs.numel() + targets.numel()
        if self.elements > self.max_elements:
            self.flush()

    def flush(self) -> None:
        """Update the metrics with everything kept (one update per run of equal shapes) and forget it."""
        if not self.outputs:
            return
        outputs, targets = self.outputs, self.targets
        self.clear()
        start = 0
        for end in range(1, len(outputs) + 1):
            if end < len(outputs) and _same_rows(outputs[start], outputs[end]) and _same_rows(
                targets[start], targets[end]
            ):
                continue
            if end - start == 1:
                run_outputs, run_targets = outputs[start], targets[start]
            else:
                run_outputs, run_targets = torch.cat(outputs[start:end]), torch.cat(targets[start:end])
            with native_bincount():  # torchmetrics' counting under deterministic: true grows with samples x bins
                self.update(run_outputs, run_targets)
            start = end

    def clear(self) -> None:
        """Forget the kept steps without updating the metrics."""
        self.outputs, self.targets, self.elements = [], [], 0


def _same_rows(a: Tensor, b: Tensor) -> bool:
    """Whether two batches can be concatenated along the batch dimension (same rank, shape after it and dtype)."""
    return a.ndim == b.ndim and a.shape[1:] == b.shape[1:] and a.dtype == b.dtype and a.device == b.device


__all__ = ["DeferredMetricUpdates"]
