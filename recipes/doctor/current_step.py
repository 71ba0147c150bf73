"""The training step in progress, as the per-step checks read it: batch, batch index, loss and gradient norm.

``LoopDoctor`` records it once for all its checks (one ``loss.detach()``, one gradient norm and one host-device sync
per step however many checks read them); a check used on its own records its own (``StepCheck``).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from recipes.doctor.base import DoctorCheck, DoctorPart
from recipes.doctor.findings import FindingsReporter

BATCH_HOOKS = ("on_train_batch_start", "on_before_backward", "on_train_batch_end")


def total_gradient_norm(optimizer: torch.optim.Optimizer) -> float | None:
    """The 2-norm of all gradients of ``optimizer``'s parameters (one host-device sync); ``None`` without gradients."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return None
    if hasattr(torch.nn.utils, "get_total_norm"):
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    else:  # pragma: no cover - torch < 2.6
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    return float(total)


class CurrentStep(DoctorPart):
    """Records the training step in progress for the checks that read it.

    Args:
        record_batch: Keep the batch (until the batch ends), its index and its loss (detached, from
            ``on_before_backward``; ``None`` until the backward pass).
        measure_gradients: Compute the total gradient norm before each optimizer step (before clipping), in
            ``gradient_norm`` (``None`` when no parameter has a gradient).
    """

    def __init__(self, record_batch: bool = True, measure_gradients: bool = True) -> None:
        self.record_batch = record_batch
        self.measure_gradients = measure_gradients
        super().__init__()

    def reset(self) -> None:
        self.batch: Any = None
        self.batch_idx = -1
        self.loss: Tensor | None = None
        self.gradient_norm: float | None = None

    def hooks(self) -> tuple[str, ...]:
        needed = (BATCH_HOOKS if self.record_batch else ()) + (
            ("on_before_optimizer_step",) if self.measure_gradients else ()
        )
        return tuple(name for name in super().hooks() if name in needed)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.batch = batch
        self.batch_idx = batch_idx
        self.loss = None

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        self.loss = loss.detach()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.batch = None

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        self.gradient_norm = total_gradient_norm(optimizer)


class StepCheck(DoctorCheck):
    """A check that reads the ``CurrentStep``: the shared one inside ``LoopDoctor``, or one of its own when used
    alone (then this check forwards the recording hooks to it; ``needs_batch``/``needs_gradients`` say which).

    The batch hooks of this class only record: a subclass reads the step and does not override them.
    """

    needs_batch = False
    needs_gradients = False

    def __init__(self, reporter: FindingsReporter | None = None, step: CurrentStep | None = None) -> None:
        self.records_step = step is None
        self.step = step if step is not None else CurrentStep(self.needs_batch, self.needs_gradients)
        super().__init__(reporter)

    def reset(self) -> None:
        if self.records_step:
            self.step.reset()

    def hooks(self) -> tuple[str, ...]:
        names = super().hooks()
        if self.records_step and self.needs_batch:
            return names
        return tuple(name for name in names if name not in BATCH_HOOKS)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.records_step and self.needs_batch:
            self.step.on_train_batch_start(trainer, pl_module, batch, batch_idx)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        if self.records_step and self.needs_batch:
            self.step.on_before_backward(trainer, pl_module, loss)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.records_step and self.needs_batch:
            self.step.on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def measure_gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> float | None:
        """The step's total gradient norm: measured now by a check used alone, read from the shared step otherwise
        (measured by ``CurrentStep``, which ``LoopDoctor`` calls first)."""
        if self.records_step:
            self.step.on_before_optimizer_step(trainer, pl_module, optimizer)
        return self.step.gradient_norm


__all__ = ["BATCH_HOOKS", "CurrentStep", "StepCheck", "total_gradient_norm"]
