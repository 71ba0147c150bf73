"""Regression: MSE, Huber or L1 loss; MAE, RMSE and R2; optional target standardization."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from torchmetrics import MeanAbsoluteError, MeanSquaredError, MetricCollection, R2Score

from lightning_modules.batches import batch_length, split_batch
from lightning_modules.data_checks import check_data_size, check_output_shape
from lightning_modules.kept_signature import kept_signature
from lightning_modules.losses import regression_loss, warn_if_old_loss_method
from lightning_modules.member_outputs import mean_prediction, member_rows
from lightning_modules.task import StepOutput, Task


class RegressionModule(Task):
    """Train a network to predict one or more real-valued targets.

    With ``standardize_targets`` the loss is computed on targets standardized with the mean and std of the
    train split (measured once at the start of fit and stored in the checkpoint); ``predict_step`` and the
    metrics always work in the original units.

    The training loss is ``self.loss``, torch's loss module for ``loss`` (``nn.MSELoss``, ``nn.HuberLoss``,
    ``nn.L1Loss``), called on the (standardized) predictions and targets; a subclass may set its own ``nn.Module``.

    A network may return k ensemble members' predictions, ``(batch, k, out_features)``, as
    ``lightning_modules.models.TabM`` does: in training mode every member learns from the batch (the training loss
    is the mean of the members' losses, on standardized targets when ``standardize_targets``); everything else
    (``val/loss``, the metrics, ``predict_step``) uses the ensemble, the members' mean prediction in the original
    units.

    The other arguments (``optimizer``, ``schedule``, ``monitor``, ``monitor_mode``, ``compile``, ``channels_last``)
    are ``Task``'s, passed on through ``**kwargs``; ``monitor`` defaults to ``val/loss``.

    Args:
        model: The network; outputs ``(batch, out_features)`` (``(batch, 1)`` for one target).
        out_features: Number of targets predicted per sample.
        loss: "mse", "huber" or "l1".
        huber_delta: Threshold of the Huber loss (in standardized units when ``standardize_targets``).
        standardize_targets: Learn on targets standardized with train-split statistics.
    """

    default_monitor = "val/loss"

    def __init__(
        self,
        model: nn.Module,
        out_features: int = 1,
        loss: Literal["mse", "huber", "l1"] = "mse",
        huber_delta: float = 1.0,
        standardize_targets: bool = False,
        **kwargs: Any,
    ) -> None:
        if out_features < 1:
            raise ValueError(f"RegressionModule: out_features must be >= 1, got {out_features}")
        if loss not in ("mse", "huber", "l1"):
            raise ValueError(f"RegressionModule: loss must be 'mse', 'huber' or 'l1', got {loss!r}")
        if huber_delta <= 0:
            raise ValueError(f"RegressionModule: huber_delta must be > 0, got {huber_delta}")
        self.out_features = out_features
        self.loss_name = loss
        self.huber_delta = huber_delta
        self.standardize_targets = standardize_targets
        super().__init__(model, **kwargs)
        self.register_buffer("target_mean", torch.zeros(out_features))
        self.register_buffer("target_std", torch.ones(out_features))
        self.register_buffer("target_stats_fitted", torch.tensor(False))
        self.old_loss_method = warn_if_old_loss_method(self)  # a subclass's loss() of earlier versions: called as before
        if not self.old_loss_method:
            #: the training loss (an ``nn.Module``; a subclass may set its own)
            self.loss = regression_loss(loss, huber_delta)

    def build_metrics(self) -> MetricCollection:
        return MetricCollection(
            {
                "mae": MeanAbsoluteError(),
                "rmse": MeanSquaredError(squared=False),
                "r2": R2Score(multioutput="uniform_average") if self.out_features > 1 else R2Score(),
            }
        )

    @classmethod
    def data_mismatch(cls, datamodule: Any) -> str | None:
        """A data module with an int ``num_classes`` has class labels, not numeric targets."""
        classes = getattr(datamodule, "num_classes", None)
        if isinstance(classes, int):
            return (
                f"{cls.__name__} needs numeric targets, but {type(datamodule).__name__} has {classes} classes: use "
                "lightning_modules.ClassificationModule, or a numeric target (TabularDataModule: task: regression)"
            )
        return None

    def check_data(self, datamodule: Any) -> None:
        check_data_size(self, datamodule, "out_features", "{} target(s)")

    def on_train_start(self) -> None:
        if self.standardize_targets and not bool(self.target_stats_fitted):
            self.fit_target_statistics(self.trainer.train_dataloader)

    @torch.no_grad()
    def fit_target_statistics(self, loader: Any) -> None:
        """Mean and std of the train split's targets, from one sequential pass over the train dataset.

        The pass reads ``loader.dataset`` in order (not the loader itself, whose shuffling and DDP sharding must
        stay untouched), so every rank computes the same statistics.
        """
        dataset = getattr(loader, "dataset", None)
        if dataset is None:
            raise ValueError("RegressionModule: standardize_targets needs a train DataLoader over a map-style dataset")
        sequential = DataLoader(dataset, batch_size=getattr(loader, "batch_size", None) or 256,
                                collate_fn=getattr(loader, "collate_fn", None))
        total = torch.zeros(self.out_features, dtype=torch.float64)
        squares = torch.zeros(self.out_features, dtype=torch.float64)
        count = 0
        for batch in sequential:
            _, targets = split_batch(batch)
            if targets is None:
                raise ValueError("RegressionModule: standardize_targets needs batches with targets")
            values = targets.double().reshape(len(targets), -1).cpu()
            total += values.sum(0)
            squares += (values**2).sum(0)
            count += len(values)
        mean = total / count
        std = (squares / count - mean**2).clamp_min(0).sqrt()
        self.target_mean.copy_(mean.float())
        self.target_std.copy_(torch.where(std > 0, std, torch.ones_like(std)).float())
        self.target_stats_fitted.fill_(True)

    def network_predictions(self, inputs: Any) -> tuple[Tensor, bool]:
        """The network's output in the original target units, checked against ``out_features`` and squeezed for one
        target, and whether it holds k ensemble members' predictions: ``(batch, k, out_features)`` (one target:
        ``(batch, k)``) instead of ``(batch, out_features)``."""
        raw = self.run_model(inputs)
        if raw.ndim == 1:
            raw = raw.unsqueeze(-1)
        members = raw.ndim == 3
        check_output_shape(
            raw,
            ("batch", "k", self.out_features) if members else ("batch", self.out_features),
            f"RegressionModule(out_features={self.out_features})",
            exact_ndim=False,
        )
        raw = raw * self.target_std + self.target_mean
        return (raw.squeeze(-1) if self.out_features == 1 else raw), members

    def predictions(self, inputs: Any) -> Tensor:
        """Network output in the original target units, shaped like the targets: ``(batch,)`` for one target. A
        network's k members' predictions become their mean."""
        preds, members = self.network_predictions(inputs)
        return mean_prediction(preds) if members else preds

    def compute_loss(self, predictions: Tensor, targets: Tensor) -> Tensor:
        """``self.loss`` of a batch, on standardized values when ``standardize_targets`` (a subclass's ``loss()``
        method of earlier versions: on the values as they are)."""
        if self.old_loss_method:
            return self.loss(predictions, targets)
        predictions = (predictions - self.target_mean.squeeze()) / self.target_std.squeeze()
        targets = (targets - self.target_mean.squeeze()) / self.target_std.squeeze()
        return self.loss(predictions, targets)

    def forward_batch(self, batch: Any) -> StepOutput:
        inputs, targets = split_batch(batch)
        if targets is None:
            raise ValueError("RegressionModule: training and evaluation batches need targets")
        targets = targets.float()
        if self.out_features == 1 and targets.ndim == 2 and targets.shape[1] == 1:
            targets = targets.squeeze(1)
        member_preds, members = self.network_predictions(inputs)
        preds = mean_prediction(member_preds) if members else member_preds
        if preds.shape != targets.shape:
            raise ValueError(
                f"RegressionModule: predictions of shape {tuple(preds.shape)} do not match targets of shape "
                f"{tuple(targets.shape)}"
            )
        if members and self.training:  # every member learns from the batch: the mean of the members' losses
            loss = self.compute_loss(*member_rows(member_preds, targets))
        else:
            loss = self.compute_loss(preds, targets)
        return StepOutput(loss, preds.detach(), targets, batch_length(inputs))

    def prediction_columns(self, outputs: Tensor, datamodule: Any = None) -> dict[str, list[Any]]:
        """``prediction`` in the original target units (``prediction_0..k`` for several targets)."""
        values = outputs.reshape(len(outputs), -1).float()
        if values.shape[1] == 1:
            return {"prediction": values[:, 0].tolist()}
        return {f"prediction_{i}": values[:, i].tolist() for i in range(values.shape[1])}

    @kept_signature
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Predictions in the original target units."""
        inputs, _ = split_batch(batch)
        return self.predictions(inputs)
