"""Optimizer parameter groups and learning-rate schedules.

A schedule is a small object that knows its interval (per optimizer step or per epoch) and what it needs to be
built (the total number of optimizer steps, a monitored metric). ``Task.configure_optimizers`` hands it the
optimizer and ``trainer.estimated_stepping_batches``, which already accounts for gradient accumulation, devices,
``limit_train_batches`` and ``max_steps``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any, Literal

from torch import nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR, ReduceLROnPlateau

from lightning_modules.compat import BATCH_AND_INSTANCE_NORM

NORM_LAYERS: tuple[type[nn.Module], ...] = (
    BATCH_AND_INSTANCE_NORM,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


def param_groups(
    model: nn.Module,
    lr_factors: Mapping[str, tuple[float, str]] | None = None,
    also_frozen: Collection[nn.Parameter] = (),
) -> list[dict[str, Any]]:
    """Split trainable parameters into a weight-decay group and a no-decay group, per learning-rate part.

    Biases, norm-layer weights and any other parameter with fewer than two dimensions get ``weight_decay=0``;
    every other weight keeps the optimizer's configured weight decay (the group carries no ``weight_decay`` key,
    so the optimizer's own default applies).

    ``lr_factors`` (parameter name -> (factor, part label), from ``LearningRateParts.factors``) splits the groups
    further by part: a group named "<part>/decay" carries ``lr_factor`` (applied by ``apply_lr_factors`` once the
    optimizer exists). ``also_frozen``: parameters without ``requires_grad`` that go into the groups anyway (frozen
    now, unfrozen on schedule: the optimizer skips a parameter without a gradient, and the schedule built now covers
    it from the first step).
    """
    frozen_ids = {id(p) for p in also_frozen}
    names = {id(p): n for n, p in model.named_parameters()}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not (param.requires_grad or id(param) in frozen_ids):
                continue
            seen.add(id(param))
            kind = "no_decay" if isinstance(module, NORM_LAYERS) or name.endswith("bias") or param.ndim < 2 else "decay"
            factor, part = (lr_factors or {}).get(names.get(id(param), ""), (1.0, ""))
            key = (part, kind)
            if key not in groups:
                group: dict[str, Any] = {"params": [], "name": f"{part}/{kind}" if part else kind}
                if kind == "no_decay":
                    group["weight_decay"] = 0.0
                if factor != 1.0:
                    group["lr_factor"] = factor
                groups[key] = group
            groups[key]["params"].append(param)
    # the default layout first ("decay", then "no_decay"), then each part in the network's order
    parts = list(dict.fromkeys(part for part, _ in groups))
    order = sorted(groups, key=lambda key: (key[0] != "", parts.index(key[0]), key[1] == "no_decay"))
    return [groups[key] for key in order]


def apply_lr_factors(optimizer: Optimizer) -> Optimizer:
    """Multiply the learning rate of each group carrying ``lr_factor`` by it (once, before a schedule is built)."""
    for group in optimizer.param_groups:
        factor = group.get("lr_factor")
        if factor is not None and not group.get("lr_factor_applied"):
            group["lr"] = group["lr"] * factor
            group["lr_factor_applied"] = True
    return optimizer


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """The multiplier of the base LR at optimizer step ``step`` (0-based).

    Identical to ``get_cosine_schedule_with_warmup`` of the production-loop article: linear warmup ``step /
    warmup_steps``, then cosine decay from 1 to ``min_lr_ratio`` over the remaining ``total_steps -
    warmup_steps`` steps. Unlike the article's version it clamps past the end instead of rising again.
    """
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    progress = float(step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    progress = min(progress, 1.0)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class Schedule:
    """Base class of the learning-rate schedules a task accepts.

    Subclasses set ``interval`` ("step" or "epoch") and ``needs_total_steps`` and implement ``build``.
    """

    interval: Literal["step", "epoch"] = "step"
    needs_total_steps: bool = False

    def build(
        self, optimizer: Optimizer, total_steps: int | None, monitor: str, mode: Literal["min", "max"]
    ) -> dict[str, Any] | None:
        """Return a Lightning ``lr_scheduler`` config dict, or ``None`` for no scheduler."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Flat parameters that identify the schedule (logged to the tracker)."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}


class Constant(Schedule):
    """Keep the optimizer's learning rate fixed for the whole run."""

    def build(
        self, optimizer: Optimizer, total_steps: int | None, monitor: str, mode: Literal["min", "max"]
    ) -> dict[str, Any] | None:
        return None


class WarmupCosine(Schedule):
    """Linear warmup, then cosine decay to ``min_lr_ratio`` of the base LR, stepped once per optimizer step.

    Args:
        warmup_steps: Optimizer steps of linear warmup from 0 to the base LR.
        warmup_fraction: Warmup as a fraction of the total optimizer steps (overrides ``warmup_steps``).
        min_lr_ratio: Final LR as a fraction of the base LR.
    """

    interval = "step"
    needs_total_steps = True

    def __init__(self, warmup_steps: int = 0, warmup_fraction: float | None = None, min_lr_ratio: float = 0.0) -> None:
        if warmup_steps < 0:
            raise ValueError(f"WarmupCosine: warmup_steps must be >= 0, got {warmup_steps}")
        if warmup_fraction is not None and not 0.0 <= warmup_fraction < 1.0:
            raise ValueError(f"WarmupCosine: warmup_fraction must be in [0, 1), got {warmup_fraction}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"WarmupCosine: min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.warmup_steps = warmup_steps
        self.warmup_fraction = warmup_fraction
        self.min_lr_ratio = min_lr_ratio

    def resolved_warmup_steps(self, total_steps: int) -> int:
        """Warmup length in optimizer steps for a run of ``total_steps``."""
        if self.warmup_fraction is not None:
            return int(round(self.warmup_fraction * total_steps))
        return self.warmup_steps

    def build(
        self, optimizer: Optimizer, total_steps: int | None, monitor: str, mode: Literal["min", "max"]
    ) -> dict[str, Any] | None:
        assert total_steps is not None
        warmup = self.resolved_warmup_steps(total_steps)
        if warmup >= total_steps:
            raise ValueError(
                f"WarmupCosine: warmup ({warmup} steps) must be shorter than the run ({total_steps} optimizer steps)"
            )

        def factor(step: int) -> float:
            return warmup_cosine_factor(step, warmup, total_steps, self.min_lr_ratio)

        return {"scheduler": LambdaLR(optimizer, factor), "interval": "step", "frequency": 1, "name": "lr"}


class OneCycle(Schedule):
    """torch's ``OneCycleLR`` over exactly the run's optimizer steps, stepped once per optimizer step.

    Args:
        max_lr: Peak LR; default: the optimizer's configured LR.
        pct_start: Fraction of the steps spent increasing the LR.
        div_factor: Initial LR is ``max_lr / div_factor``.
        final_div_factor: Final LR is ``initial_lr / final_div_factor``.
        anneal_strategy: "cos" or "linear".
    """

    interval = "step"
    needs_total_steps = True

    def __init__(
        self,
        max_lr: float | None = None,
        pct_start: float = 0.3,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        anneal_strategy: Literal["cos", "linear"] = "cos",
    ) -> None:
        if not 0.0 < pct_start < 1.0:
            raise ValueError(f"OneCycle: pct_start must be in (0, 1), got {pct_start}")
        self.max_lr = max_lr
        self.pct_start = pct_start
        self.div_factor = div_factor
        self.final_div_factor = final_div_factor
        self.anneal_strategy = anneal_strategy

    def build(
        self, optimizer: Optimizer, total_steps: int | None, monitor: str, mode: Literal["min", "max"]
    ) -> dict[str, Any] | None:
        assert total_steps is not None
        if self.pct_start * total_steps == 1:  # OneCycleLR's first phase would end at step 0: it divides by zero
            raise ValueError(
                f"OneCycle: pct_start={self.pct_start} of a {total_steps}-step run is a warm-up of exactly one "
                "optimizer step, which torch's OneCycleLR cannot schedule: change pct_start or the number of steps"
            )
        if self.max_lr is None:
            max_lr: float | list[float] = [g["lr"] for g in optimizer.param_groups]
        else:  # a part with its own learning-rate factor peaks at that fraction of max_lr
            max_lr = [self.max_lr * g.get("lr_factor", 1.0) for g in optimizer.param_groups]
        scheduler = OneCycleLR(
            optimizer,
            max_lr=max_lr,
            total_steps=total_steps,
            pct_start=self.pct_start,
            div_factor=self.div_factor,
            final_div_factor=self.final_div_factor,
            anneal_strategy=self.anneal_strategy,
        )
        return {"scheduler": scheduler, "interval": "step", "frequency": 1, "name": "lr"}


class Plateau(Schedule):
    """``ReduceLROnPlateau`` on a validation metric, checked once per epoch.

    Args:
        monitor: Metric to watch; default: the task's monitored metric (e.g. ``val/loss``).
        mode: "min" or "max"; default: the task's mode when ``monitor`` is the task's metric, else from the name
            of ``monitor`` ("min" for losses and errors, "max" for scores).
        factor: Multiply the LR by this when the metric stalls.
        patience: Epochs without improvement before the LR is lowered.
        threshold: Minimum relative change that counts as an improvement.
        min_lr: Lower bound on the LR.
    """

    interval = "epoch"

    def __init__(
        self,
        monitor: str | None = None,
        mode: Literal["min", "max"] | None = None,
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        min_lr: float = 0.0,
    ) -> None:
        if not 0.0 < factor < 1.0:
            raise ValueError(f"Plateau: factor must be in (0, 1), got {factor}")
        if patience < 0:
            raise ValueError(f"Plateau: patience must be >= 0, got {patience}")
        self.monitor = monitor
        self.mode = mode
        self.factor = factor
        self.patience = patience
        self.threshold = threshold
        self.min_lr = min_lr

    def build(
        self, optimizer: Optimizer, total_steps: int | None, monitor: str, mode: Literal["min", "max"]
    ) -> dict[str, Any] | None:
        scheduler = ReduceLROnPlateau(
            optimizer,
            mode=self.mode or mode,
            factor=self.factor,
            patience=self.patience,
            threshold=self.threshold,
            min_lr=self.min_lr,
        )
        return {
            "scheduler": scheduler,
            "interval": "epoch",
            "frequency": 1,
            "monitor": self.monitor or monitor,
            "strict": True,
            "name": "lr",
        }


def total_optimizer_steps(estimated_stepping_batches: float | int, schedule: Schedule) -> int:
    """Validate ``trainer.estimated_stepping_batches`` for a schedule that needs a finite run length."""
    if estimated_stepping_batches is None or math.isinf(estimated_stepping_batches):
        raise ValueError(
            f"{type(schedule).__name__} needs a finite number of optimizer steps, but the trainer runs without end "
            "(max_epochs=-1 and max_steps=-1). Set trainer.max_epochs or trainer.max_steps."
        )
    steps = int(estimated_stepping_batches)
    if steps < 1:
        raise ValueError(
            f"{type(schedule).__name__} needs at least one optimizer step, but the trainer plans {steps}: "
            "check max_epochs/max_steps, limit_train_batches and that the train split is not empty."
        )
    return steps


__all__ = [
    "Constant",
    "OneCycle",
    "Plateau",
    "Schedule",
    "WarmupCosine",
    "apply_lr_factors",
    "param_groups",
    "total_optimizer_steps",
    "warmup_cosine_factor",
]
