"""The ``non_finite`` check: a NaN/inf loss or gradient stops the run, and no checkpoint of its weights is written.

001's ``check_nan``: the message names the global step, the batch and the first parameter with a non-finite
gradient, and the bad rows when the batch's inputs hold NaN/inf; the run's checkpoints keep the last good weights,
and an MLflow run ends FAILED with the reason in the tag ``doctor.failure``.

The check reads nothing back to the host on an ordinary step (``CurrentStep`` keeps the loss, the input rows' flags
and the gradient norm on the device). A non-finite step is found at the next read: before the optimizer step of a
logging step, of the epoch's last batch or the run's last step (then it is stopped before the optimizer applies it,
as a per-step check would), at the start of a validation, and before every checkpoint save. Found after its update,
the weights in memory are non-finite: the run stops, the message says so, and no checkpoint of them is written.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch

from recipes.doctor.current_step import CurrentStep, ReadStep, StepCheck, input_tensors, nonfinite_row_flags
from recipes.doctor.findings import FindingsReporter
from recipes.doctor.gradient_norm import GradientNormCheck


class NonFiniteError(RuntimeError):
    """A NaN or inf loss or gradient: the run is stopped before the optimizer step applies it."""


def first_nonfinite_rows(inputs: Any) -> list[int]:
    """Rows (first dimension) of the floating-point input tensors that hold a NaN or inf."""
    rows: set[int] = set()
    for t in input_tensors(inputs):
        flags = nonfinite_row_flags(t)
        if flags is not None:
            rows.update(torch.nonzero(flags).flatten().tolist())
    return sorted(rows)


def first_nonfinite_gradient(pl_module: pl.LightningModule) -> str | None:
    """Name of the first parameter (in ``named_parameters`` order) whose gradient holds a NaN or inf."""
    for name, param in pl_module.named_parameters():
        if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
            return name
    return None


class NonFiniteCheck(StepCheck):
    """Stop the run at the first NaN or inf loss or gradient (``NonFiniteError``); no checkpoint of non-finite
    weights is written.

    Args:
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.
        step: The shared ``CurrentStep`` (loss, input rows, gradient norm); ``None``: this check keeps its own.
        gradient_norms: The gradient-norm check whose recent norms the message quotes (how the norm grew before
            the step went non-finite); ``None``: the message leaves them out.

    Reads nothing back to the host on an ordinary training step; see the module's docstring for when it reads.
    """

    name = "non_finite"
    needs_batch = True
    needs_gradients = True
    read_order = 2

    def __init__(
        self,
        reporter: FindingsReporter | None = None,
        step: CurrentStep | None = None,
        gradient_norms: GradientNormCheck | None = None,
    ) -> None:
        self.gradient_norms = gradient_norms
        super().__init__(reporter, step)

    def reset(self) -> None:
        super().reset()
        for callback in getattr(self, "_saves_on_exception", []):
            callback.save_on_exception = True  # turned off for a failure of the previous fit
        self._saves_on_exception: list[Any] = []
        self.weights_non_finite = False

    def read_steps(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps: list[ReadStep], bad: ReadStep | None
    ) -> None:
        if bad is not None:
            self.fail(trainer, pl_module, bad)

    def before_checkpoint_save(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.weights_non_finite:
            raise NonFiniteError(
                "not saving a checkpoint: the weights are non-finite since the step the loop doctor's non_finite "
                "check stopped the run at (see its message); the last checkpoint saved before is the last good one"
            )

    def fail(self, trainer: pl.Trainer, pl_module: pl.LightningModule, bad: ReadStep) -> None:
        """Stop the run: the finding (where, which parameter, the likely cause), tag ``doctor.failure``, the error."""
        what = f"loss ({bad.loss})" if bad.loss is not None and not math.isfinite(bad.loss) else (
            f"gradient (total norm {bad.gradient_norm})"
        )
        where = f"global step {bad.global_step} (epoch {bad.epoch}, batch {bad.batch_idx})"
        if bad.applied:
            first = "not known (the step was read after its update)"
        else:
            param = first_nonfinite_gradient(pl_module)
            first = param if param is not None else "none (all gradients are finite)"
        message = f"non-finite {what} at {where}; first parameter with a non-finite gradient: {first}"
        if bad.bad_rows:
            shown = ", ".join(str(r) for r in bad.bad_rows[:5]) + (" ..." if len(bad.bad_rows) > 5 else "")
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
        if bad.applied:
            ran = trainer.global_step - bad.global_step
            message += (
                f". Found {ran} optimizer step(s) later (the check reads the device's values every "
                f"log_every_n_steps={trainer.log_every_n_steps} steps, at each epoch end and before every checkpoint "
                "save): the weights in memory are non-finite and no checkpoint of them is written; the last saved "
                "checkpoint is the last good one."
            )
            self.weights_non_finite = True
            for callback in trainer.checkpoint_callbacks:
                if getattr(callback, "save_on_exception", False):
                    callback.save_on_exception = False  # it would save the non-finite weights
                    self._saves_on_exception.append(callback)
        else:
            message += ". Stopped before the optimizer step applied it: the weights and checkpoints stay finite."
        self.reporter.fail(trainer, self.name, NonFiniteError, message, step=bad.global_step, epoch=bad.epoch)


__all__ = ["NonFiniteCheck", "NonFiniteError", "first_nonfinite_gradient", "first_nonfinite_rows"]
