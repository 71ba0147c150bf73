"""Metric updates that count with ``torch.bincount`` when torch's deterministic algorithms are on.

torchmetrics counts classes with its ``_bincount``, which replaces ``torch.bincount`` by a comparison of every sample
with every bin (an ``N x bins`` tensor) whenever ``torch.are_deterministic_algorithms_enabled()`` (torchmetrics issue
3086, open in 1.9). A multiclass F1 score or confusion matrix has ``num_classes**2`` bins, so under ``deterministic:
true`` (Lightning's ``Trainer(deterministic=True)``, which several recipes set) the cost grows with the square of the
classes: one update of 2,000 samples took 1.9 ms with 10 classes, 241 ms and 330 MB with 100, and 8.6 s and a 3.3 GB
peak with 300 (against 0.7-1.4 ms natively), on a 2-core CPU; the epoch's deferred update of a 784-input MLP with 10
classes took 5.8 ms instead of 0.7.

``torch.bincount`` without weights is deterministic on the CPU and on CUDA (torch's flag raises only for a CUDA
``bincount`` with ``weights``, its documentation says; integer counts do not depend on the order of additions), so the
fallback buys nothing there. ``native_bincount`` turns the flag off for the duration of a metric update and back on as
it was (``warn_only`` included), also when the update raises. The flag is process-wide: another thread running torch
operations during an update would see it off too (loopwise's own threads run none). Inside a metric update that scatters
floats on CUDA (``scatter_add_``, e.g. ``CalibrationError``), sums then follow CUDA's atomic order: values can differ in
their last bits from run to run, where the flag would have raised or warned.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def native_bincount() -> Iterator[None]:
    """torch's deterministic-algorithms flag off inside (torchmetrics then counts with ``torch.bincount``), restored
    as it was on the way out."""
    if not torch.are_deterministic_algorithms_enabled():
        yield
        return
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)


__all__ = ["native_bincount"]
