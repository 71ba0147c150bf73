"""Classification: multiclass (softmax + cross entropy) and binary (one logit + BCE with logits)."""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.classification import Accuracy, F1Score

from lightning_modules.optim import Schedule
from lightning_modules.task import StepOutput, Task, batch_length, split_batch


class ClassificationModule(Task):
    """Train a network to classify its inputs.

    ``multiclass``: the network outputs ``num_classes`` logits; cross entropy with optional label smoothing and
    class weights. ``binary``: the network outputs one logit; BCE with logits, class weights become
    ``pos_weight = w[1] / w[0]``. Metrics: accuracy and macro F1 per stage (``val/acc``, ``val/f1``, ...).

    Args:
        model: The network; its output width must be ``num_classes`` (multiclass) or 1 (binary).
        num_classes: Number of classes (2 for binary).
        task: "multiclass" or "binary".
        label_smoothing: Amount of label smoothing in [0, 1).
        class_weights: One loss weight per class (e.g. inverse class frequency), or null for equal weights.
        optimizer: A callable that builds the optimizer from parameter groups (default ``torch.optim.AdamW``).
        schedule: Learning-rate schedule: ``WarmupCosine``, ``OneCycle``, ``Plateau`` or ``Constant`` (default).
        monitor: Metric that defines "best" (default ``val/acc``).
        monitor_mode: "min" or "max" for ``monitor`` (default: from the metric name).
    """

    default_monitor = "val/acc"

    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        task: Literal["multiclass", "binary"] = "multiclass",
        label_smoothing: float = 0.0,
        class_weights: list[float] | None = None,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        schedule: Schedule | None = None,
        monitor: str | None = None,
        monitor_mode: Literal["min", "max"] | None = None,
    ) -> None:
        if task not in ("multiclass", "binary"):
            raise ValueError(f"ClassificationModule: task must be 'multiclass' or 'binary', got {task!r}")
        if num_classes < 2:
            raise ValueError(f"ClassificationModule: num_classes must be >= 2, got {num_classes}")
        if task == "binary" and num_classes != 2:
            raise ValueError(f"ClassificationModule: task='binary' needs num_classes=2, got {num_classes}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"ClassificationModule: label_smoothing must be in [0, 1), got {label_smoothing}")
        if class_weights is not None:
            if len(class_weights) != num_classes:
                raise ValueError(
                    f"ClassificationModule: class_weights has {len(class_weights)} values for {num_classes} classes"
                )
            if any(w <= 0 for w in class_weights):
                raise ValueError(f"ClassificationModule: class_weights must be > 0, got {list(class_weights)}")
        self.num_classes = num_classes
        self.task = task
        self.label_smoothing = label_smoothing
        super().__init__(model, optimizer=optimizer, schedule=schedule, monitor=monitor, monitor_mode=monitor_mode)
        weights = torch.tensor(class_weights, dtype=torch.float32) if class_weights is not None else None
        self.register_buffer("class_weights", weights, persistent=False)

    @property
    def out_features(self) -> int:
        """Output width the network must have."""
        return 1 if self.task == "binary" else self.num_classes

    def build_metrics(self) -> MetricCollection:
        kwargs: dict[str, Any] = {"task": self.task}
        if self.task == "multiclass":
            kwargs["num_classes"] = self.num_classes
        return MetricCollection({"acc": Accuracy(**kwargs), "f1": F1Score(average="macro", **kwargs)})

    def check_data(self, datamodule: Any) -> None:
        data_classes = getattr(datamodule, "num_classes", None)
        if data_classes is not None and data_classes != self.num_classes:
            raise ValueError(
                f"{type(datamodule).__name__} has {data_classes} classes but ClassificationModule has "
                f"num_classes={self.num_classes}: set model.init_args.num_classes (and the network's output "
                f"width) to {data_classes}"
            )

    def loss(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Cross entropy (multiclass) or BCE with logits (binary), with smoothing and class weights."""
        if self.task == "multiclass":
            return F.cross_entropy(logits, targets, weight=self.class_weights, label_smoothing=self.label_smoothing)
        soft = targets.float()
        if self.label_smoothing > 0:
            soft = soft * (1.0 - self.label_smoothing) + 0.5 * self.label_smoothing
        pos_weight = None
        if self.class_weights is not None:
            pos_weight = self.class_weights[1:2] / self.class_weights[0]
        return F.binary_cross_entropy_with_logits(logits, soft, pos_weight=pos_weight)

    def logits(self, inputs: Any) -> Tensor:
        """Network output, checked against the expected width; binary logits are squeezed to ``(batch,)``."""
        logits = self.run_model(inputs)
        if logits.ndim != 2 or logits.shape[-1] != self.out_features:
            raise ValueError(
                f"ClassificationModule(task={self.task!r}, num_classes={self.num_classes}) expects the network to "
                f"output shape (batch, {self.out_features}), got {tuple(logits.shape)}: check the network's "
                "output width"
            )
        return logits.squeeze(-1) if self.task == "binary" else logits

    def forward_batch(self, batch: Any) -> StepOutput:
        inputs, targets = split_batch(batch)
        if targets is None:
            raise ValueError("ClassificationModule: training and evaluation batches need labels")
        logits = self.logits(inputs)
        return StepOutput(self.loss(logits, targets), logits.detach(), targets, batch_length(inputs))

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Class probabilities: ``(batch, num_classes)`` for multiclass, ``(batch,)`` P(class 1) for binary."""
        inputs, _ = split_batch(batch)
        logits = self.logits(inputs)
        return torch.sigmoid(logits) if self.task == "binary" else logits.softmax(dim=-1)
