"""The ``non_finite`` check: a NaN/inf loss or gradient stops the run before the optimizer step applies it.

001's ``check_nan``: the message names the global step, the batch and the first parameter with a non-finite
gradient, and the bad rows when the batch's inputs hold NaN/inf; the run's checkpoints keep the last good weights,
and an MLflow run ends FAILED with the reason in the tag ``doctor.failure``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from lightning_modules.task import split_batch
from recipes.doctor.current_step import CurrentStep, StepCheck
from recipes.doctor.findings import FindingsReporter
from recipes.doctor.gradient_norm import GradientNormCheck


class NonFiniteError(RuntimeError):
    """A NaN or inf loss or gradient: the run is stopped before the optimizer step applies it."""


def first_nonfinite_rows(inputs: Any) -> list[int]:
    """Rows (first dimension) of the floating-point input tensors that hold a NaN or inf."""
    tensors: list[Tensor] = []
    if isinstance(inputs, Tensor):
        tensors = [inputs]
    elif isinstance(inputs, Mapping):
        tensors = [v for v in inputs.values() if isinstance(v, Tensor)]
    elif isinstance(inputs, (tuple, list)):
        tensors = [v for v in inputs if isinstance(v, Tensor)]
    rows: set[int] = set()
    for t in tensors:
        if t.is_floating_point() and t.ndim >= 1 and t.numel():
            bad = ~torch.isfinite(t.detach().reshape(t.shape[0], -1)).all(dim=1)
            rows.update(torch.nonzero(bad).flatten().tolist())
    return sorted(rows)


def first_nonfinite_gradient(pl_module: pl.LightningModule) -> str | None:
    """Name of the first parameter (in ``named_parameters`` order) whose gradient holds a NaN or inf."""
    for name, param in pl_module.named_parameters():
        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
            return name
    return None


class NonFiniteCheck(StepCheck):
    """Stop the run at the first NaN or inf loss or gradient, before the optimizer applies it (``NonFiniteError``).

    Args:
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.
        step: The shared ``CurrentStep`` (batch, loss, gradient norm); ``None``: this check records its own.
        gradient_norms: The gradient-norm check whose recent norms the message quotes (how the norm grew before
            the step went non-finite); ``None``: the message leaves them out.

    Costs one host-device sync per step (is the loss finite?) besides the gradient norm it shares.
    """

    name = "non_finite"
    needs_batch = True
    needs_gradients = True

    def __init__(
        self,
        reporter: FindingsReporter | None = None,
        step: CurrentStep | None = None,
        gradient_norms: GradientNormCheck | None = None,
    ) -> None:
        self.gradient_norms = gradient_norms
        super().__init__(reporter, step)

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loss = self.step.loss
        if loss is not None and not bool(torch.isfinite(loss).all()):
            self.fail(trainer, pl_module, f"loss ({float(loss.float().mean())})")

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        norm = self.measure_gradients(trainer, pl_module, optimizer)
        if norm is None or math.isfinite(norm):
            return
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return  # fp16 GradScaler: it skips this step and lowers its scale
        self.fail(trainer, pl_module, f"gradient (total norm {norm})")

    def fail(self, trainer: pl.Trainer, pl_module: pl.LightningModule, what: str) -> None:
        """Stop the run: the finding (where, which parameter, the likely cause), tag ``doctor.failure``, the error."""
        param = first_nonfinite_gradient(pl_module)
        where = f"global step {trainer.global_step} (epoch {trainer.current_epoch}, batch {self.step.batch_idx})"
        first = param if param is not None else "none (all gradients are finite)"
        message = f"non-finite {what} at {where}; first parameter with a non-finite gradient: {first}"
        rows: list[int] = []
        if self.step.batch is not None:
            try:
                inputs, _ = split_batch(self.step.batch)
                rows = first_nonfinite_rows(inputs)
            except ValueError:
                rows = []
        if rows:
            shown = ", ".join(str(r) for r in rows[:5]) + (" ..." if len(rows) > 5 else "")
            message += f". The batch's inputs hold NaN/inf in row(s) {shown} of the batch: check the data"
        else:
            lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
            message += f". The inputs are finite: the learning rate (lr={lr}) is the likely cause, lower it"
            recent = self.gradient_norms.recent_norms if self.gradient_norms is not None else ()
            if len(recent) >= 2:
                message += (
                    f" (the gradient norm before clipping went from {recent[0]:.3g} to "
                    f"{recent[-1]:.3g} over the last {len(recent)} optimizer steps)"
                )
            if not trainer.gradient_clip_val:
                message += "; add gradient clipping (gradient_clip_val=1.0)"
            message += "; otherwise look for log(0) or a division by zero in the loss, and prefer bf16 to fp16"
        message += ". Stopped before the optimizer step applied it: the weights and checkpoints stay finite."
        self.reporter.fail(trainer, self.name, NonFiniteError, message)


__all__ = ["NonFiniteCheck", "NonFiniteError", "first_nonfinite_gradient", "first_nonfinite_rows"]
