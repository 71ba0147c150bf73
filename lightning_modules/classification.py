"""Classification: multiclass (softmax + cross entropy), binary and multilabel (sigmoid + BCE with logits)."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import AUROC, Accuracy, ConfusionMatrix, F1Score

from lightning_modules.batches import batch_length, split_batch
from lightning_modules.data_checks import check_data_size, check_output_shape
from lightning_modules.kept_signature import kept_signature
from lightning_modules.losses import ClassificationLoss, warn_if_old_loss_method
from lightning_modules.member_outputs import mean_probability_logits, member_rows
from lightning_modules.task import StepOutput, Task


def inverse_frequency_weights(class_counts: list[int]) -> list[float]:
    """``n / (k * n_c)`` per class (scikit-learn's "balanced"): every class contributes equally to the loss."""
    if any(c <= 0 for c in class_counts):
        empty = [i for i, c in enumerate(class_counts) if c <= 0]
        raise ValueError(f"class_weights='auto': class(es) {empty} have no training samples (counts {class_counts})")
    total, k = sum(class_counts), len(class_counts)
    return [total / (k * c) for c in class_counts]


def class_names_of(datamodule: Any, num_classes: int) -> list[str]:
    """The data module's ``class_names`` as strings when it has ``num_classes`` of them, else "0".."C-1"."""
    try:
        names = getattr(datamodule, "class_names", None)
    except (RuntimeError, ValueError):
        names = None
    if names is None or len(names) != num_classes:
        return [str(i) for i in range(num_classes)]
    return [str(name) for name in names]


class ClassificationModule(Task):
    """Train a network to classify its inputs.

    ``multiclass``: the network outputs ``num_classes`` logits; cross entropy with optional label smoothing and
    class weights. ``binary``: one logit; BCE with logits, class weights become ``pos_weight = w[1] / w[0]``.
    ``multilabel``: ``num_classes`` independent logits and 0/1 targets of shape ``(batch, num_classes)``; BCE with
    logits, class weights are per-label ``pos_weight``. Label smoothing is a training-only term: ``train/loss``
    includes it, ``val/loss`` and ``test/loss`` are the plain (class-weighted) loss of the logits, so runs with
    different smoothing compare. Metrics: accuracy and macro F1 per stage (``val/acc``, ``val/f1``), AUROC on
    val/test (``val/auroc``), and the confusion matrix of the last val/test epoch in ``last_confusion_matrix``
    (multiclass and binary).

    A network may return k ensemble members' logits, ``(batch, k, num_classes)`` (binary: ``(batch, k, 1)``), as
    ``lightning_modules.models.TabM`` does: in training mode every member learns from the batch (the training loss
    is the mean of the members' losses, with the class weights and label smoothing); everything else uses the
    ensemble, the members' mean probability (softmax for multiclass, sigmoid for binary and multilabel), whose
    logits (log of the mean probability; logit of it for sigmoid tasks) give ``val/loss`` (the ensemble's log loss),
    the metrics and ``predict_step``.

    The training loss is ``self.loss``, a ``ClassificationLoss`` built from these arguments (called with the
    task's ``class_weights``); a subclass may set its own ``nn.Module`` instead (``self.loss =
    nn.CrossEntropyLoss(weight=...)``), called as ``self.loss(logits, targets)``.

    The other arguments (``optimizer``, ``schedule``, ``monitor``, ``monitor_mode``, ``compile``, ``channels_last``)
    are ``Task``'s, passed on through ``**kwargs``; ``monitor`` defaults to ``val/acc``.

    Args:
        model: The network; its output width must be ``num_classes`` (1 for binary).
        num_classes: Number of classes (2 for binary; number of labels for multilabel).
        task: "multiclass", "binary" or "multilabel".
        label_smoothing: Amount of label smoothing in [0, 1), in the training loss only.
        class_weights: One loss weight per class, "auto" for inverse class frequency from the data module's
            ``class_counts`` (multiclass and binary), or null for equal weights.
    """

    default_monitor = "val/acc"

    def __init__(
        self,
        model: nn.Module,
        num_classes: int,
        task: Literal["multiclass", "binary", "multilabel"] = "multiclass",
        label_smoothing: float = 0.0,
        class_weights: list[float] | Literal["auto"] | None = None,
        **kwargs: Any,
    ) -> None:
        name = "ClassificationModule"
        if task not in ("multiclass", "binary", "multilabel"):
            raise ValueError(f"{name}: task must be 'multiclass', 'binary' or 'multilabel', got {task!r}")
        if num_classes < 2:
            raise ValueError(f"{name}: num_classes must be >= 2, got {num_classes}")
        if task == "binary" and num_classes != 2:
            raise ValueError(f"{name}: task='binary' needs num_classes=2, got {num_classes}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"{name}: label_smoothing must be in [0, 1), got {label_smoothing}")
        if class_weights == "auto":
            if task == "multilabel":
                raise ValueError(f"{name}: class_weights='auto' is for multiclass and binary tasks")
        elif class_weights is not None:
            if len(class_weights) != num_classes:
                raise ValueError(f"{name}: class_weights has {len(class_weights)} values for {num_classes} classes")
            if any(w <= 0 for w in class_weights):
                raise ValueError(f"{name}: class_weights must be > 0, got {list(class_weights)}")
        self.num_classes = num_classes
        self.task = task
        self.label_smoothing = label_smoothing
        self.auto_class_weights = class_weights == "auto"
        self.weighted_classes = class_weights is not None
        super().__init__(model, **kwargs)
        fixed = class_weights if isinstance(class_weights, list) else [1.0] * num_classes
        # always a tensor (ones = unweighted) so it is part of every checkpoint, "auto" weights included
        self.register_buffer("class_weights", torch.tensor(fixed, dtype=torch.float32))
        self.last_confusion_matrix: dict[str, Tensor] = {}
        if task != "multilabel":
            self.val_confusion = ConfusionMatrix(**self._metric_kwargs(), validate_args=False)  # as the metrics
            self.test_confusion = ConfusionMatrix(**self._metric_kwargs(), validate_args=False)
        self.old_loss_method = warn_if_old_loss_method(self)  # a subclass's loss() of earlier versions: called as before
        if not self.old_loss_method:
            #: the training loss (an ``nn.Module``; a subclass may set its own)
            self.loss = ClassificationLoss(task, label_smoothing)

    @property
    def out_features(self) -> int:
        """Output width the network must have."""
        return 1 if self.task == "binary" else self.num_classes

    def _metric_kwargs(self) -> dict[str, Any]:
        if self.task == "multiclass":
            return {"task": "multiclass", "num_classes": self.num_classes}
        if self.task == "multilabel":
            return {"task": "multilabel", "num_labels": self.num_classes}
        return {"task": "binary"}

    def build_metrics(self) -> MetricCollection:
        kwargs = self._metric_kwargs()
        return MetricCollection({"acc": Accuracy(**kwargs), "f1": F1Score(average="macro", **kwargs)})

    def build_eval_metrics(self) -> MetricCollection:
        kwargs = self._metric_kwargs()
        if self.task != "binary":
            kwargs["average"] = "macro"
        return MetricCollection({"auroc": AUROC(**kwargs)})

    @classmethod
    def data_mismatch(cls, datamodule: Any) -> str | None:
        """A data module whose ``num_classes`` is ``None`` has no class labels (a regression target)."""
        if getattr(datamodule, "num_classes", 0) is None:
            return (
                f"{cls.__name__} needs class labels, but {type(datamodule).__name__} has none (a regression "
                "target): use lightning_modules.RegressionModule, or data with class labels (TabularDataModule: "
                "task: classification)"
            )
        return None

    def check_data(self, datamodule: Any) -> None:
        check_data_size(self, datamodule, "num_classes", "{} classes")

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.auto_class_weights and stage == "fit":
            datamodule = self.trainer.datamodule
            counts = getattr(datamodule, "class_counts", None)
            if counts is None:
                raise ValueError(
                    "ClassificationModule: class_weights='auto' needs a data module with class_counts (the train "
                    "split's samples per class); give explicit class_weights instead"
                )
            self.class_weights.copy_(torch.tensor(inverse_frequency_weights(list(counts)), dtype=torch.float32))

    def compute_loss(self, logits: Tensor, targets: Tensor, smoothing: bool = True) -> Tensor:
        """``self.loss`` of a batch: the built-in ``ClassificationLoss`` with the class weights, and with label
        smoothing when ``smoothing`` (the training loss; ``evaluation_loss`` passes ``False``); a subclass's own
        loss module as ``self.loss(logits, targets)``."""
        if isinstance(self.loss, ClassificationLoss):
            return self.loss(logits, targets, self.class_weights, smoothing)
        if self.old_loss_method and not smoothing:
            return self.loss(logits, targets, smoothing=False)
        return self.loss(logits, targets)

    def network_logits(self, inputs: Any) -> tuple[Tensor, bool]:
        """The network's output checked against the expected width (binary logits squeezed), and whether it holds
        k ensemble members' logits: ``(batch, k, width)`` (binary: ``(batch, k)``) instead of ``(batch, width)``."""
        logits = self.run_model(inputs)
        members = logits.ndim == 3
        check_output_shape(
            logits,
            ("batch", "k", self.out_features) if members else ("batch", self.out_features),
            f"ClassificationModule(task={self.task!r}, num_classes={self.num_classes})",
            ": check the network's output width",
        )
        return (logits.squeeze(-1) if self.task == "binary" else logits), members

    def logits(self, inputs: Any) -> Tensor:
        """Network output, checked against the expected width; binary logits are squeezed to ``(batch,)``. A
        network's k members' logits become the logits of their mean probability (``mean_probability_logits``)."""
        logits, members = self.network_logits(inputs)
        return mean_probability_logits(logits, self.task == "multiclass") if members else logits

    def probabilities(self, logits: Tensor) -> Tensor:
        """Softmax over classes (multiclass) or per-output sigmoid (binary, multilabel)."""
        return logits.softmax(dim=-1) if self.task == "multiclass" else torch.sigmoid(logits)

    def forward_batch(self, batch: Any) -> StepOutput:
        inputs, targets = split_batch(batch)
        if targets is None:
            raise ValueError("ClassificationModule: training and evaluation batches need labels")
        member_logits, members = self.network_logits(inputs)
        logits = mean_probability_logits(member_logits, self.task == "multiclass") if members else member_logits
        if self.task != "multilabel" and targets.ndim == 2 and targets.shape != logits.shape:
            raise ValueError(
                f"ClassificationModule(task={self.task!r}) got soft targets of shape {tuple(targets.shape)}: they "
                f"need task='multiclass' and shape {tuple(logits.shape)} (batch, num_classes)"
            )
        if self.task == "multilabel" and targets.shape != logits.shape:
            raise ValueError(
                f"ClassificationModule(task='multilabel') needs targets of shape {tuple(logits.shape)} "
                f"(batch, num_classes), got {tuple(targets.shape)}"
            )
        # a weighted cross entropy is a mean over the batch's summed class weights, not over its samples
        weight = None
        if self.weighted_classes and self.task == "multiclass":
            weight = (targets * self.class_weights).sum() if targets.is_floating_point() else self.class_weights[
                targets].sum()
        if members and self.training:  # every member learns from the batch: the mean of the members' losses
            loss = self.compute_loss(*member_rows(member_logits, targets))
        else:
            loss = self.compute_loss(logits, targets)
        return StepOutput(loss, logits.detach(), targets, batch_length(inputs), weight)

    def evaluation_loss(self, out: StepOutput) -> Tensor:
        """The val/test loss: the batch's loss without label smoothing (recomputed from its logits only when the
        task smooths; a subclass's own loss module: the batch's loss)."""
        if self.label_smoothing == 0 or not (self.old_loss_method or isinstance(self.loss, ClassificationLoss)):
            return out.loss
        return self.compute_loss(out.outputs, out.targets, smoothing=False)

    def metric_inputs(self, out: StepOutput) -> tuple[Tensor, Tensor]:
        targets = out.targets.long() if self.task == "multilabel" else out.targets
        if self.task == "multiclass" and targets.is_floating_point():  # soft targets: their most likely class
            targets = targets.argmax(dim=-1)
        return self.probabilities(out.outputs), targets

    def _confusion(self, stage: str) -> Metric | None:
        return getattr(self, f"{stage}_confusion", None)

    def update_metrics(self, stage: str, outputs: Tensor, targets: Tensor) -> None:
        super().update_metrics(stage, outputs, targets)
        confusion = self._confusion(stage)
        if confusion is not None:
            confusion.update(*self.metric_inputs_of(outputs, targets))

    def _finish_confusion(self, stage: str) -> None:
        confusion = self._confusion(stage)
        if confusion is not None and confusion.update_count > 0:
            self.last_confusion_matrix[stage] = confusion.compute().detach().cpu()
            confusion.reset()

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        self._finish_confusion("val")

    def on_test_epoch_end(self) -> None:
        super().on_test_epoch_end()
        self._finish_confusion("test")

    def prediction_columns(self, outputs: Tensor, datamodule: Any = None) -> dict[str, list[Any]]:
        """``prediction`` (the class name with the highest probability) and one ``prob_<class>`` column per class;
        multilabel: a 0/1 column ``<label>`` (probability >= 0.5) and ``prob_<label>`` per label. Class names are
        the data module's ``class_names`` (the class ids without them)."""
        names = class_names_of(datamodule, self.num_classes)
        probs = outputs.reshape(len(outputs), -1).float()
        columns: dict[str, list[Any]] = {}
        if self.task == "multilabel":
            for i, name in enumerate(names):
                columns[name] = (probs[:, i] >= 0.5).int().tolist()
            for i, name in enumerate(names):
                columns[f"prob_{name}"] = probs[:, i].tolist()
            return columns
        if self.task == "binary":
            probs = torch.cat([1.0 - probs[:, :1], probs[:, :1]], dim=1)
        columns["prediction"] = [names[i] for i in probs.argmax(dim=1).tolist()]
        for i, name in enumerate(names):
            columns[f"prob_{name}"] = probs[:, i].tolist()
        return columns

    @kept_signature
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Probabilities: ``(batch, num_classes)`` (multiclass, multilabel) or ``(batch,)`` P(class 1) (binary)."""
        inputs, _ = split_batch(batch)
        return self.probabilities(self.logits(inputs))
