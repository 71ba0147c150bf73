"""Metrics of the tasks: torchmetrics per stage, the val/test loss (``MeanLoss``), metric updates gathered on the
device (``DeferredMetricUpdates``) and the partial epoch's training metrics kept in a checkpoint."""

from lightning_modules.metrics.deferred_metric_updates import DeferredMetricUpdates
from lightning_modules.metrics.evaluation_loss import MeanLoss
from lightning_modules.metrics.stage_metrics import stage_metrics

__all__ = ["DeferredMetricUpdates", "MeanLoss", "stage_metrics"]
