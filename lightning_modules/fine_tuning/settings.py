"""Fine-tuning settings of a task: initial weights, frozen parts and their schedule, learning rates per part.

``FineTuning`` holds what a ``Task``'s fine-tuning arguments ask for, checked against the network when the task is
built (a pattern that names nothing is an error before any data is read), and answers the task's questions: the
optimizer's parameter groups, the callbacks Lightning should run, the norm layers to keep in eval mode, the
trainable and frozen parameter counts of each phase, and whether the first batch's loss can be predicted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.callbacks import Callback
from torch import nn

from lightning_modules.fine_tuning.freezing import FreezeSchedule
from lightning_modules.fine_tuning.initial_weights import InitialWeights, WeightsReport, load_initial_weights
from lightning_modules.fine_tuning.learning_rates import LearningRateParts
from lightning_modules.fine_tuning.part_names import resolve_keys, resolve_patterns
from lightning_modules.optim.parameter_groups import param_groups

#: ``init_from`` references that only ``recipes`` can turn into a file (an MLflow run's checkpoint)
TRACKED_REFERENCE_PREFIXES = ("mlflow:", "run:")


class LoadInitialWeights(Callback):
    """Load a task's ``init_from`` when a run starts (fit, validate, test or predict), unless a checkpoint was
    restored into it first (``Task.on_load_checkpoint``): Lightning restores a ``ckpt_path`` after ``setup``, before
    these hooks, so a resumed or evaluated checkpoint never needs the initial file."""

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module.load_initial_weights()

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module.load_initial_weights()

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module.load_initial_weights()

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        pl_module.load_initial_weights()


class FineTuning:
    """A task's fine-tuning arguments, checked against its network (see ``Task`` for their meaning)."""

    def __init__(
        self,
        network: nn.Module,
        init_from: str | InitialWeights | Mapping[str, Any] | None = None,
        freeze: list[str] | None = None,
        unfreeze_at_epoch: int | Mapping[str, int] | None = None,
        lr_multipliers: Mapping[str, float] | None = None,
        layerwise_lr_decay: float | None = None,
    ) -> None:
        self.network = network
        self.initial_weights = InitialWeights.of(init_from)
        # "backbone", "head": the network's own names for its parts (lightning_modules.fine_tuning.part_names)
        freeze = resolve_patterns(network, freeze)
        if isinstance(unfreeze_at_epoch, Mapping):
            unfreeze_at_epoch = resolve_keys(network, unfreeze_at_epoch)
        lr_multipliers = resolve_keys(network, lr_multipliers)
        if unfreeze_at_epoch is not None and not freeze:
            raise ValueError("unfreeze_at_epoch needs freeze: name the modules to freeze until then")
        self.freeze_schedule = FreezeSchedule(network, list(freeze), unfreeze_at_epoch) if freeze else None
        self.lr_parts = LearningRateParts(lr_multipliers, layerwise_lr_decay)
        self.lr_parts.check(network)
        #: what loading ``init_from`` did (``None`` until it is loaded)
        self.weights_report: WeightsReport | None = None
        #: the network holds its initial or trained weights: loaded from ``init_from`` or from a checkpoint
        self.weights_in_place = False

    @property
    def starts_pretrained(self) -> bool:
        """Whether the network starts from trained weights: ``init_from``, or a network that says so
        (``pretrained = True``, e.g. the Hugging Face networks). Its first loss is then no fresh network's."""
        return self.initial_weights is not None or bool(getattr(self.network, "pretrained", False))

    def restored_from_checkpoint(self) -> None:
        """A checkpoint's weights were restored into the network: ``init_from`` is not loaded over them."""
        self.weights_in_place = True

    def load_weights(self, path: str | None = None) -> WeightsReport | None:
        """Load ``init_from`` (or ``path``, its local copy) into the network once; ``None`` without ``init_from``."""
        spec = self.initial_weights
        if spec is None or self.weights_in_place:
            return self.weights_report
        if path is None and spec.path.startswith(TRACKED_REFERENCE_PREFIXES):
            raise ValueError(
                f"init_from {spec.path}: the recipes command fetches a tracked run's checkpoint; in your own code "
                "pass the file (download it with mlflow.artifacts.download_artifacts)"
            )
        self.weights_report = load_initial_weights(self.network, spec, path)
        self.weights_in_place = True
        return self.weights_report

    def param_groups(self, task: nn.Module, network_prefix: str = "model.") -> list[dict[str, Any]]:
        """``optim.param_groups`` of ``task`` with this network's learning-rate parts and scheduled-frozen
        parameters (names in ``task`` are the network's under ``network_prefix``)."""
        factors = None
        if self.lr_parts.active:
            factors = {network_prefix + name: v for name, v in self.lr_parts.factors(self.network).items()}
        frozen = self.freeze_schedule.scheduled_parameters() if self.freeze_schedule is not None else []
        return param_groups(task, factors, frozen)

    def callbacks(self) -> list[Callback]:
        """The callbacks the task hands Lightning (``configure_callbacks``): loading ``init_from`` and the freeze
        schedule, where they apply."""
        loader: list[Callback] = [LoadInitialWeights()] if self.initial_weights is not None else []
        return loader + ([self.freeze_schedule] if self.freeze_schedule is not None else [])

    def frozen_norm_layers(self) -> list[nn.Module]:
        """Norm layers frozen right now: kept in eval mode."""
        return self.freeze_schedule.frozen_norm_layers() if self.freeze_schedule is not None else []

    def phases(self) -> list[tuple[int, int, int]]:
        """(first epoch, trainable, frozen) parameter counts of the network per phase; one phase without ``freeze``."""
        if self.freeze_schedule is not None:
            return self.freeze_schedule.phases()
        counts = [(p.numel(), p.requires_grad) for p in self.network.parameters()]
        trainable = sum(n for n, grad in counts if grad)
        return [(0, trainable, sum(n for n, _ in counts) - trainable)]

    def describe(self) -> dict[str, Any]:
        """Flat settings for the tracker (only those set)."""
        out: dict[str, Any] = {}
        if self.initial_weights is not None:
            out.update({f"init_from.{k}": v for k, v in self.initial_weights.describe().items()})
        if self.freeze_schedule is not None:
            out["freeze"] = {p: e for p, e in self.freeze_schedule.unfreeze_epochs.items()}
        if self.lr_parts.lr_multipliers:
            out["lr_multipliers"] = self.lr_parts.lr_multipliers
        if self.lr_parts.layerwise_lr_decay is not None:
            out["layerwise_lr_decay"] = self.lr_parts.layerwise_lr_decay
        return out


__all__ = ["FineTuning", "LoadInitialWeights", "TRACKED_REFERENCE_PREFIXES"]
