"""The tasks' losses as ``nn.Module`` attributes (``task.loss``), which a subclass may replace with its own.

``ClassificationModule`` and ``RegressionModule`` compute their training loss with ``self.loss``: the module built
here from their arguments, or any ``nn.Module`` a subclass sets in its ``__init__``
(``self.loss = nn.CrossEntropyLoss(weight=...)``), called as ``self.loss(outputs, targets)``. The modules here hold
no tensors, so a checkpoint's keys are those of the task without them (checkpoints of earlier versions load).

A subclass that still overrides the ``loss()`` method of earlier versions keeps working for one release, with one
``DeprecationWarning`` (``warn_if_old_loss_method``).
"""

from __future__ import annotations

import inspect
import types
import warnings
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn


def soft_cross_entropy(logits: Tensor, targets: Tensor, weight: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Cross entropy with class probabilities ``targets`` (batch, C), smoothed as ``F.cross_entropy`` smooths, and
    weighted as it weights integer labels: per sample by the target-weighted class weight, the mean over their sum.
    A one-hot target gives exactly ``F.cross_entropy`` of its class index."""
    total = F.cross_entropy(logits, targets, weight=weight, label_smoothing=label_smoothing, reduction="sum")
    return total / (targets * weight).sum()  # elementwise, not a matmul that autocast would run in bf16


class ClassificationLoss(nn.Module):
    """Cross entropy (multiclass: integer labels or class probabilities) or BCE with logits (binary, multilabel),
    with optional class weights and label smoothing.

    Args:
        task: "multiclass", "binary" or "multilabel".
        label_smoothing: Amount of label smoothing in [0, 1), applied when ``forward`` is called with ``smoothing``.
    """

    def __init__(self, task: Literal["multiclass", "binary", "multilabel"], label_smoothing: float = 0.0) -> None:
        super().__init__()
        self.task = task
        self.label_smoothing = label_smoothing

    def forward(self, logits: Tensor, targets: Tensor, weight: Tensor | None = None, smoothing: bool = True) -> Tensor:
        """The loss of ``logits`` against ``targets``; ``weight``: one weight per class (the task's
        ``class_weights``), ``None`` for equal weights; ``smoothing=False``: without label smoothing."""
        amount = self.label_smoothing if smoothing else 0.0
        if self.task == "multiclass":
            if targets.is_floating_point():  # soft targets (batch, num_classes): mixup/cutmix
                weight = weight if weight is not None else logits.new_ones(logits.shape[-1])
                return soft_cross_entropy(logits, targets, weight, amount)
            return F.cross_entropy(logits, targets, weight=weight, label_smoothing=amount)
        soft = targets.float()
        if amount > 0:
            soft = soft * (1.0 - amount) + 0.5 * amount
        pos_weight = None
        if weight is not None:
            pos_weight = weight[1:2] / weight[0] if self.task == "binary" else weight
        return F.binary_cross_entropy_with_logits(logits, soft, pos_weight=pos_weight)


def regression_loss(name: Literal["mse", "huber", "l1"], huber_delta: float = 1.0) -> nn.Module:
    """torch's loss module for ``name``: ``nn.MSELoss``, ``nn.HuberLoss(delta=huber_delta)`` or ``nn.L1Loss``."""
    if name == "mse":
        return nn.MSELoss()
    if name == "huber":
        return nn.HuberLoss(delta=huber_delta)
    return nn.L1Loss()


def warn_if_old_loss_method(task: nn.Module) -> bool:
    """Whether ``task``'s class overrides the ``loss()`` method of earlier versions (then it is called as before,
    and ``task.loss`` is that method); warns once per construction when it does."""
    if not isinstance(inspect.getattr_static(type(task), "loss", None), types.FunctionType):
        return False
    warnings.warn(
        f"{type(task).__name__}.loss() overrides a method that is now an attribute: set self.loss = <an nn.Module> "
        "in __init__ instead (the method still works in this release)",
        DeprecationWarning,
        stacklevel=3,
    )
    return True


__all__ = ["ClassificationLoss", "regression_loss", "soft_cross_entropy", "warn_if_old_loss_method"]
