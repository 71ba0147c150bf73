"""One torchmetrics collection per stage (train, val, test), built from a task's metrics.

Each stage gets its own clone (``train/``, ``val/``, ``test/`` prefixes), so the stages never share state; the
evaluation-only metrics (AUROC, which keeps every prediction of the epoch) go to val and test only. torchmetrics'
per-batch argument checks are switched off: the loss has just consumed the same targets (cross entropy rejects a class
index out of range) and the data modules check labels when they load them, while those checks read values back to the
host and cost about as much as a small network's forward pass.
"""

from __future__ import annotations

from torchmetrics import MetricCollection


def stage_metrics(
    metrics: MetricCollection, eval_only: MetricCollection
) -> tuple[MetricCollection, MetricCollection, MetricCollection]:
    """The (train, val, test) collections: clones of ``metrics``, plus clones of ``eval_only`` for val and test."""
    train, val, test = (metrics.clone(prefix=f"{stage}/") for stage in ("train", "val", "test"))
    if len(eval_only):
        val.add_metrics(dict(eval_only.clone().items()))
        test.add_metrics(dict(eval_only.clone().items()))
    for collection in (train, val, test):
        for metric in collection.values():
            if hasattr(metric, "validate_args"):
                metric.validate_args = False
    return train, val, test


__all__ = ["stage_metrics"]
