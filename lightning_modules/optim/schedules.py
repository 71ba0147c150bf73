"""Learning-rate schedules.

A schedule is a small object that knows its interval (per optimizer step or per epoch) and what it needs to be
built (the total number of optimizer steps, a monitored metric). ``Task.configure_optimizers`` hands it the
optimizer and ``trainer.estimated_stepping_batches``, which already accounts for gradient accumulation, devices,
``limit_train_batches`` and ``max_steps``.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR, ReduceLROnPlateau


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
    "total_optimizer_steps",
    "warmup_cosine_factor",
]
