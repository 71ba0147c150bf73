"""The ``baseline`` check: the run's validation metric next to the trivial predictor's, and accuracy on a skewed table.

A model that scores below the trivial predictor (the train split's majority class for a classifier, the train split's
mean for a regression) has learnt nothing usable, yet its accuracy can look fine: 0.86 sounds good until one learns
that 88% of the rows are one class. Issue 55 measured exactly that on a user's imbalanced table. The check:

* at the start of a fit, when the task's monitor is accuracy (``val/acc``) and one class holds at least
  ``skew_threshold`` of the train split, a finding: the checkpoint and early stopping then favour a metric that
  always predicting the majority class already reaches; ``val/loss`` (or ``val/auroc``) ranks models by what they
  learnt;
* at the end of training, the last validation's ``val/acc`` (classification) or ``val/rmse`` (regression) against
  the trivial predictor's on the same validation rows (fitted on the train split's targets): a finding when the model
  is worse by more than the noise of a validation split that size (two standard errors of the trivial predictor's
  value over n >= ``min_rows`` validation rows: sqrt((p(1-p) + 1/n)/n) for an accuracy p, floored so that a split of
  one class still has some; sd(e^2)/(2 RMSE sqrt(n)) for an RMSE, the delta method on the trivial residuals e, which
  still understates the noise of heavy-tailed targets), a note with both numbers otherwise. A model exactly as good as
  the trivial predictor is flagged in about 2% of runs.

It reads the split's targets from a data module with ``datasets`` (``SplitDatasets``) whose train and val datasets
hold (inputs, targets) tensors (``TensorDataset``, ``BatchedTensorDataset``); with other data it does nothing.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from datamodules.recipe_contract import SplitDatasets
from lightning_modules.recipe_contract import MonitoredTask
from recipes.doctor.base import DoctorCheck
from recipes.doctor.findings import FindingsReporter

ACCURACY = "val/acc"
RMSE = "val/rmse"


def split_targets(datamodule: Any, split: str) -> Tensor | None:
    """The targets of ``split`` when the data module holds them as the second tensor of a tensor dataset."""
    if not isinstance(datamodule, SplitDatasets):
        return None
    dataset = datamodule.datasets.get(split)
    tensors = getattr(dataset, "tensors", None)  # TensorDataset and BatchedTensorDataset: (inputs, targets)
    if not isinstance(tensors, tuple) or len(tensors) != 2 or not isinstance(tensors[1], Tensor):
        return None
    return tensors[1].detach().cpu()


class TrivialBaselineCheck(DoctorCheck):
    """Compare the run's validation accuracy or RMSE with the trivial predictor's, and flag accuracy as the monitor of
    a table where one class dominates.

    Args:
        skew_threshold: The share of the train split's majority class from which a monitored accuracy is flagged.
        min_rows: Fewer validation rows than this compare nothing (a tiny split's metric is noise).
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.

    After a fit, ``trivial`` is the trivial predictor's validation value (``{"val/acc": 0.88}`` or
    ``{"val/rmse": 12.5}``), empty when the data module does not expose its targets.
    """

    name = "baseline"

    def __init__(
        self, skew_threshold: float = 0.8, min_rows: int = 20, reporter: FindingsReporter | None = None
    ) -> None:
        if not 0.5 < skew_threshold <= 1.0:
            raise ValueError(f"TrivialBaselineCheck: skew_threshold must be in (0.5, 1], got {skew_threshold}")
        self.skew_threshold = skew_threshold
        self.min_rows = min_rows
        super().__init__(reporter)

    def reset(self) -> None:
        super().reset()
        self.trivial: dict[str, float] = {}
        self.noise: dict[str, float] = {}  # one standard error of each trivial value
        self.majority_share: float | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = trainer.datamodule
        train, val = split_targets(datamodule, "train"), split_targets(datamodule, "val")
        if train is None or not len(train):
            return
        if train.dtype in (torch.int64, torch.int32) and train.ndim == 1:
            counts = torch.bincount(train)
            majority = int(counts.argmax())
            self.majority_share = float(counts[majority]) / len(train)
            if val is not None and len(val) >= self.min_rows:
                share = float((val == majority).float().mean())
                self.trivial[ACCURACY] = share
                self.noise[ACCURACY] = math.sqrt((share * (1 - share) + 1 / len(val)) / len(val))
            monitor = pl_module.monitor if isinstance(pl_module, MonitoredTask) else None
            if monitor == ACCURACY and self.majority_share >= self.skew_threshold:
                self.reporter.report(
                    trainer,
                    self.name,
                    f"the monitor is {ACCURACY} but {self.majority_share:.0%} of the train split is one class, so "
                    f"always predicting it scores about {self.majority_share:.3f}: the best checkpoint and early "
                    "stopping then favour a model for what it did not learn; monitor val/loss (or val/auroc) with "
                    "--model.init_args.monitor val/loss, and read macro-F1 and AUROC beside accuracy",
                )
        elif train.is_floating_point() and val is not None and len(val) >= self.min_rows:
            mean = train.double().mean(dim=0)
            squared = ((val.double() - mean) ** 2).flatten()
            self.trivial[RMSE] = float(squared.mean().sqrt())
            spread = float(squared.std()) if len(squared) > 1 else 0.0
            self.noise[RMSE] = spread / (2 * max(self.trivial[RMSE], 1e-12) * math.sqrt(len(squared)))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for metric, trivial in self.trivial.items():
            value = trainer.callback_metrics.get(metric)
            if value is None or not math.isfinite(float(value)):
                continue
            value = float(value)
            margin = 2 * self.noise[metric]
            worse = value < trivial - margin if metric == ACCURACY else value > trivial + margin
            predictor = "always predicting the train split's majority class" if metric == ACCURACY else (
                "predicting the train split's mean"
            )
            if worse:
                self.reporter.report(
                    trainer,
                    self.name,
                    f"the last validation's {metric} {value:.4g} is worse than {predictor} ({trivial:.4g} on the same "
                    f"rows, 2 standard errors {margin:.2g}): the model has learnt less than nothing; check the features, the learning rate and, for "
                    "a classifier, class_balance (it trades accuracy for the small classes)",
                )
            else:
                self.reporter.notes.append(f"{metric} {value:.4g}; {predictor} scores {trivial:.4g} on the same rows")


__all__ = ["TrivialBaselineCheck", "split_targets"]
