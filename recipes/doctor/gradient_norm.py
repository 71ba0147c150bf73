"""The ``grad_norm`` check: the total gradient norm before clipping, as a series and as a warning.

001: "your learning rate is likely too high" when clipping rescales nearly every step. The norm is logged every N
optimizer steps as ``doctor/grad_norm``; a finding when its median over the last steps stays at >= 5x
``gradient_clip_val`` (norm clipping only). The norms are kept on the device and read a few steps at a time
(``CurrentStep``); the norm is the one the task's clipping measured where it clips by norm, not a second one.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

import lightning.pytorch as pl

from recipes.doctor.current_step import CurrentStep, ReadStep, StepCheck
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
    read_order = 0

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

    def read_steps(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps: list[ReadStep], bad: ReadStep | None
    ) -> None:
        for step in steps:
            norm = step.gradient_norm
            if norm is None or not math.isfinite(norm):
                continue  # no optimizer step in this batch, or the fp16 GradScaler's skipped one
            self.recent_norms.append(norm)
            if step.global_step % self.every_n_steps == 0:
                self.grad_norms.append((step.global_step, norm))
                self.reporter.log_metric(trainer, "doctor/grad_norm", norm, step=step.global_step)
            self._check_against_clipping(trainer, step)

    def _check_against_clipping(self, trainer: pl.Trainer, step: ReadStep) -> None:
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
            step=step.global_step,
            epoch=step.epoch,
        )


__all__ = ["GradientNormCheck"]
