"""The ``grad_norm`` check: the total gradient norm before clipping, as a series and as a warning.

001: "your learning rate is likely too high" when clipping rescales nearly every step. The norm is logged every N
optimizer steps as ``doctor/grad_norm``; a finding when its median over the last steps stays at >= 5x
``gradient_clip_val`` (norm clipping only).
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import lightning.pytorch as pl
import torch

from recipes.doctor.current_step import CurrentStep, StepCheck
from recipes.doctor.findings import FindingsReporter


class GradientNormCheck(StepCheck):
    """Log the total gradient norm before clipping and warn when it stays far above the clip value.

    Args:
        every_n_steps: Log ``doctor/grad_norm`` every this many optimizer steps.
        window: Optimizer steps over which the median gradient norm is compared with the clip value.
        clip_factor: Warn when that median is at least this many times ``gradient_clip_val``.
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.
        step: The shared ``CurrentStep`` that measures the norm; ``None``: this check measures it itself.

    ``grad_norms`` holds the logged (global step, norm) pairs; ``recent_norms`` the last ``window`` norms.
    """

    name = "grad_norm"
    needs_gradients = True

    def __init__(
        self,
        every_n_steps: int = 25,
        window: int = 10,
        clip_factor: float = 5.0,
        reporter: FindingsReporter | None = None,
        step: CurrentStep | None = None,
    ) -> None:
        if every_n_steps < 1 or window < 1 or clip_factor <= 0:
            raise ValueError(
                f"GradientNormCheck: every_n_steps and window must be >= 1 and clip_factor > 0, got {every_n_steps}, "
                f"{window}, {clip_factor}"
            )
        self.every_n_steps = every_n_steps
        self.window = window
        self.clip_factor = clip_factor
        super().__init__(reporter, step)

    def reset(self) -> None:
        super().reset()
        self.grad_norms: list[tuple[int, float]] = []  # (global step, norm) of the logged steps
        self.recent_norms: deque[float] = deque(maxlen=self.window)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        norm = self.measure_gradients(trainer, pl_module, optimizer)
        if norm is None or not math.isfinite(norm):
            return  # no gradients, or non-finite ones: the non-finite guard's (or the fp16 GradScaler's) business
        step = trainer.global_step
        self.recent_norms.append(norm)
        if step % self.every_n_steps == 0:
            self.grad_norms.append((step, norm))
            self.reporter.log_metric(trainer, "doctor/grad_norm", norm)
        self._check_against_clipping(trainer)

    def _check_against_clipping(self, trainer: pl.Trainer) -> None:
        clip = trainer.gradient_clip_val
        algorithm = str(trainer.gradient_clip_algorithm or "norm").lower()
        if not clip or "value" in algorithm or self.already_reported():
            return
        if len(self.recent_norms) < self.window:
            return
        median = statistics.median(self.recent_norms)
        if median < self.clip_factor * float(clip):
            return
        lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
        self.reporter.report(
            trainer,
            self.name,
            f"the gradient norm before clipping has a median of {median:.3g} over the last {len(self.recent_norms)} "
            f"optimizer steps, >= {self.clip_factor:g}x gradient_clip_val={clip}: clipping rescales "
            f"nearly every step. The learning rate (lr={lr}) is the likely cause, not the gradients: lower it "
            "rather than clipping harder.",
        )


__all__ = ["GradientNormCheck"]
