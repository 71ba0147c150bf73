"""The ``initial_loss`` check: the first batch's loss of a fresh run vs the value the task expects.

001's debugging table: "for CrossEntropyLoss with C classes, loss ≈ log(C) at initialization". The task says what
it expects (``Task.expected_initial_loss``: ln(C) for a multiclass classifier, ln(vocab size) for a language model,
``None`` where there is no reference value); a plain LightningModule with ``task == "multiclass"`` and an int
``num_classes`` is compared with ln(num_classes).
"""

from __future__ import annotations

import math

import lightning.pytorch as pl

from lightning_modules.recipe_contract import ExpectsInitialLoss, ExplainsInitialLoss, MulticlassTask
from lightning_modules.task import initial_loss_wording
from recipes.doctor.current_step import CurrentStep, ReadStep, StepCheck
from recipes.doctor.findings import FindingsReporter


def is_multiclass_module(pl_module: pl.LightningModule) -> bool:
    """Whether the module is a softmax classifier over ``num_classes`` classes (``task="multiclass"``)."""
    if not isinstance(pl_module, MulticlassTask):
        return False
    return pl_module.task == "multiclass" and isinstance(pl_module.num_classes, int)


def expected_initial_loss(pl_module: pl.LightningModule) -> tuple[float, str] | None:
    """(value, how the message words it) of the loss ``pl_module`` should have at initialization, or ``None``.

    A module with ``expected_initial_loss()`` (every ``Task``) answers itself, worded by its
    ``explain_expected_initial_loss(value)`` when it has one; any other module is a softmax classifier over
    ``num_classes`` (``is_multiclass_module``, expected ln(num_classes)) or has no reference value.
    """
    if isinstance(pl_module, ExpectsInitialLoss):
        expected = pl_module.expected_initial_loss()
        if expected is None:
            return None
        if isinstance(pl_module, ExplainsInitialLoss):
            return expected, pl_module.explain_expected_initial_loss(expected)
        return expected, initial_loss_wording(expected)
    if is_multiclass_module(pl_module):
        classes = int(pl_module.num_classes)
        if classes >= 2:
            return math.log(classes), initial_loss_wording(math.log(classes), classes, "classes")
    return None  # binary/multilabel BCE, regression, unknown losses: no reference value


class InitialLossCheck(StepCheck):
    """Compare the first batch's loss of a fresh run with the value the module expects at initialization.

    Args:
        rel_tol: Warn when |loss - expected| exceeds this fraction of the expected value ...
        abs_tol: ... or this many nats, whichever is larger.
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.
        step: The shared ``CurrentStep`` (batch index, loss); ``None``: this check records its own.

    ``initial_loss_value`` is the first batch's loss (per batch under gradient accumulation, unscaled under an fp16
    GradScaler), ``None`` when the module has no expected value or the run resumed.
    """

    name = "initial_loss"
    needs_batch = True
    read_order = 1

    def __init__(
        self,
        rel_tol: float = 0.5,
        abs_tol: float = 0.75,
        reporter: FindingsReporter | None = None,
        step: CurrentStep | None = None,
    ) -> None:
        if rel_tol < 0 or abs_tol < 0:
            raise ValueError("InitialLossCheck: rel_tol and abs_tol must be >= 0")
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol
        super().__init__(reporter, step)

    def reset(self) -> None:
        super().reset()
        self.initial_loss_value: float | None = None
        self.pending = True  # until the first backward pass of the fit

    def read_steps(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps: list[ReadStep], bad: ReadStep | None
    ) -> None:
        first = steps[0] if steps else bad
        if first is None or not self.pending:
            return
        self.pending = False
        if first is bad or first.loss is None:
            return  # a non-finite first loss is the non_finite check's
        if first.global_step == 0 and first.batch_idx == 0:  # a fresh start, not a resumed run
            self._compare(trainer, pl_module, first)

    def _compare(self, trainer: pl.Trainer, pl_module: pl.LightningModule, first: ReadStep) -> None:
        reference = expected_initial_loss(pl_module)
        if reference is None or first.loss is None:
            return
        expected, wording = reference
        value = first.loss * trainer.accumulate_grad_batches  # Lightning divides by accumulation
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if first.loss_scaled and scaler is not None:
            value /= float(scaler.get_scale())  # read before the batch ended: the fp16 GradScaler's scaled loss
        self.initial_loss_value = value
        margin = max(self.rel_tol * expected, self.abs_tol)
        if abs(value - expected) <= margin:
            return
        if value > expected:
            why = (
                "the freshly initialized model is confidently wrong: check the output layer's initialization scale "
                "(large initial logits), that the labels are the class indices the outputs stand for, and the "
                "output shape"
            )
        else:
            why = (
                "the task looks solved before training: check that the labels do not leak into the inputs and that "
                "the loss is the mean cross-entropy over the classes"
            )
        self.reporter.report(
            trainer,
            self.name,
            f"first-batch loss {value:.3f} vs {wording} (tolerance {margin:.2f}): {why}.",
            step=first.global_step,
            epoch=first.epoch,
        )


__all__ = ["InitialLossCheck", "expected_initial_loss", "is_multiclass_module"]
