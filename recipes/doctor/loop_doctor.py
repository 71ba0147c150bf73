"""``LoopDoctor``: the loop doctor's checks as one callback, each switchable from YAML.

It owns the enabled checks (one reporter and one ``CurrentStep`` shared by all) and forwards each Lightning hook
to the parts that define it, in one fixed order: the step record, mode, leakage, data wait, non-finite, initial
loss, gradient norm, schedule, unused parameters, baseline. The forwarding is the callback group's
(``recipes.hooks.forwarding.ForwardingCallback``); the doctor adds three hooks of its own: ``setup`` builds fresh
parts for each fit, ``on_train_end`` summarizes the findings after the parts' own, and the data-wait timer brackets
the other parts' training-batch hooks, so their time counts neither as waiting for data nor as the step's compute.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from recipes.doctor.base import CALLBACK_HOOKS, DoctorCheck, DoctorPart
from recipes.doctor.current_step import CurrentStep
from recipes.doctor.data_wait import DataWaitCheck
from recipes.doctor.findings import Finding, FindingsReporter
from recipes.doctor.gradient_norm import GradientNormCheck
from recipes.doctor.initial_loss import InitialLossCheck
from recipes.doctor.leakage import LeakageCheck
from recipes.doctor.non_finite import NonFiniteCheck
from recipes.doctor.schedule import ScheduleCheck
from recipes.doctor.train_eval_mode import TrainEvalModeCheck
from recipes.doctor.trivial_baseline import TrivialBaselineCheck
from recipes.doctor.unused_parameters import UnusedParametersCheck
from recipes.hooks.forwarding import ForwardingCallback

# the hooks LoopDoctor forwards to its parts: every Lightning hook but ``setup`` (a part's start-of-fit reset)
FORWARDED_HOOKS = CALLBACK_HOOKS
# the data-wait timer's hooks, which LoopDoctor calls in halves around the other parts' batch hooks
TIMED_HOOKS = ("on_train_batch_start", "on_train_batch_end")


class LoopDoctor(ForwardingCallback):
    """Checks that make the silent training-loop bugs of the seed articles loud; each one can be switched off.

    Findings are warned once per check (``LoopDoctorWarning``), kept in ``findings`` (``Finding(check, message,
    step, epoch)``) and, with an MLflow logger, set as run tags ``doctor.<check>``; the tag ``doctor.findings``
    lists the checks that found something ("none" for a clean run). Series are logged to the trainer's loggers:
    ``doctor/grad_norm``, ``doctor/data_wait_fraction`` (the train/val overlap is the run tag
    ``loopwise.val_train_overlap``). The non-finite guard and the schedule check stop the run (``NonFiniteError``,
    ``ScheduleError``) after setting the tag ``doctor.failure``.

    Args:
        initial_loss: Compare the first batch's loss of a multiclass classifier (or language model) with ln(C).
        initial_loss_rel_tol: Warn when |loss - ln C| exceeds this fraction of ln C ...
        initial_loss_abs_tol: ... or this many nats, whichever is larger.
        non_finite: Stop the run at the first NaN or inf loss or gradient; no checkpoint of non-finite weights is
            written. Read without a host sync per step: a non-finite step is found before its update on logging
            steps and the epoch's last batch, otherwise at the next read (see ``recipes.doctor.current_step``).
        grad_norm: Log the total gradient norm before clipping and warn when it stays far above the clip value.
        grad_norm_every_n_steps: Log ``doctor/grad_norm`` every this many optimizer steps.
        grad_norm_window: Optimizer steps over which the median gradient norm is compared with the clip value.
        grad_norm_clip_factor: Warn when that median is at least this many times ``gradient_clip_val``.
        data_wait: Measure the fraction of step time spent waiting for the next batch.
        data_wait_threshold: Hint when the typical (median) step waits more than this fraction of its time.
        data_wait_skip_batches: Batches at the start of each epoch left out (worker start-up).
        leakage: Hash the train and val samples and report val samples identical to a train sample.
        leakage_max_samples: Skip the leakage check (with a note) above this many train + val samples.
        schedule_check: Fail before training on a per-step LR schedule stepped per epoch, and after the first
            validation on a plateau schedule whose monitored metric is never logged.
        mode_check: Check that validation runs in eval mode and training resumes in train mode.
        unused_parameters: Warn about trainable parameters that get no gradient at the first optimizer step (frozen
            ones are left alone).
        baseline: Compare the last validation's accuracy or RMSE with the trivial predictor's (the train split's
            majority class or mean) on the same rows (a finding beyond two standard errors), and flag ``val/acc`` as the
            monitor of a skewed table.
        baseline_skew_threshold: The majority class's share of the train split from which a monitored accuracy is
            flagged.
    """

    def __init__(
        self,
        initial_loss: bool = True,
        initial_loss_rel_tol: float = 0.5,
        initial_loss_abs_tol: float = 0.75,
        non_finite: bool = True,
        grad_norm: bool = True,
        grad_norm_every_n_steps: int = 25,
        grad_norm_window: int = 10,
        grad_norm_clip_factor: float = 5.0,
        data_wait: bool = True,
        data_wait_threshold: float = 0.3,
        data_wait_skip_batches: int = 3,
        leakage: bool = True,
        leakage_max_samples: int = 1_000_000,
        schedule_check: bool = True,
        mode_check: bool = True,
        unused_parameters: bool = True,
        baseline: bool = True,
        baseline_skew_threshold: float = 0.8,
    ) -> None:
        if grad_norm_every_n_steps < 1:
            raise ValueError(f"LoopDoctor: grad_norm_every_n_steps must be >= 1, got {grad_norm_every_n_steps}")
        if grad_norm_window < 1:
            raise ValueError(f"LoopDoctor: grad_norm_window must be >= 1, got {grad_norm_window}")
        if grad_norm_clip_factor <= 0:
            raise ValueError(f"LoopDoctor: grad_norm_clip_factor must be > 0, got {grad_norm_clip_factor}")
        if not 0.0 < data_wait_threshold < 1.0:
            raise ValueError(f"LoopDoctor: data_wait_threshold must be in (0, 1), got {data_wait_threshold}")
        if data_wait_skip_batches < 0:
            raise ValueError(f"LoopDoctor: data_wait_skip_batches must be >= 0, got {data_wait_skip_batches}")
        if initial_loss_rel_tol < 0 or initial_loss_abs_tol < 0:
            raise ValueError("LoopDoctor: initial_loss_rel_tol and initial_loss_abs_tol must be >= 0")
        self.initial_loss = initial_loss
        self.initial_loss_rel_tol = initial_loss_rel_tol
        self.initial_loss_abs_tol = initial_loss_abs_tol
        self.non_finite = non_finite
        self.grad_norm = grad_norm
        self.grad_norm_every_n_steps = grad_norm_every_n_steps
        self.grad_norm_window = grad_norm_window
        self.grad_norm_clip_factor = grad_norm_clip_factor
        self.data_wait = data_wait
        self.data_wait_threshold = data_wait_threshold
        self.data_wait_skip_batches = data_wait_skip_batches
        self.leakage = leakage
        self.leakage_max_samples = leakage_max_samples
        self.schedule_check = schedule_check
        self.mode_check = mode_check
        self.unused_parameters = unused_parameters
        self.baseline = baseline
        self.baseline_skew_threshold = baseline_skew_threshold
        self._assemble()

    # --- the parts ----------------------------------------------------------------------------------------------
    def _assemble(self) -> None:
        """Fresh parts for the switches as they are now (at construction and at the start of every fit): one
        reporter, the shared step record, the enabled checks in forwarding order, and the table of hooks."""
        reporter = FindingsReporter()
        step = CurrentStep(
            record_batch=self.non_finite or self.initial_loss, measure_gradients=self.non_finite or self.grad_norm
        )
        gradient_norms = (
            GradientNormCheck(
                self.grad_norm_every_n_steps, self.grad_norm_window, self.grad_norm_clip_factor, reporter, step
            )
            if self.grad_norm
            else None
        )
        data_wait = (
            DataWaitCheck(self.data_wait_threshold, self.data_wait_skip_batches, reporter) if self.data_wait else None
        )
        parts: list[DoctorPart | None] = [
            step if step.record_batch or step.measure_gradients else None,
            TrainEvalModeCheck(reporter) if self.mode_check else None,
            LeakageCheck(self.leakage_max_samples, reporter) if self.leakage else None,
            data_wait,
            NonFiniteCheck(reporter, step, gradient_norms) if self.non_finite else None,
            InitialLossCheck(self.initial_loss_rel_tol, self.initial_loss_abs_tol, reporter, step)
            if self.initial_loss
            else None,
            gradient_norms,
            ScheduleCheck(reporter) if self.schedule_check else None,
            UnusedParametersCheck(reporter) if self.unused_parameters else None,
            TrivialBaselineCheck(self.baseline_skew_threshold, reporter=reporter) if self.baseline else None,
        ]
        self.reporter = reporter
        self.parts = [part for part in parts if part is not None]
        self.checks: dict[str, DoctorCheck] = {part.name: part for part in self.parts if isinstance(part, DoctorCheck)}
        self._data_wait_timer = data_wait
        forwarded: list[tuple[DoctorPart, list[str]]] = []
        for part in self.parts:
            names = part.hooks()
            if "setup" in names:  # LoopDoctor.setup builds the parts; each part's setup is its own reset
                raise TypeError(f"LoopDoctor does not forward setup (needed by {type(part).__name__})")
            # the data-wait timer's batch hooks are called in halves around the other parts' (on_train_batch_start)
            forwarded.append((part, [name for name in names if not (part is data_wait and name in TIMED_HOOKS)]))
        self.forward_to(forwarded)

    def _value(self, check: str, attribute: str, default: Any) -> Any:
        part = self.checks.get(check)
        return default if part is None else getattr(part, attribute)

    # --- what the checks found ----------------------------------------------------------------------------------
    @property
    def findings(self) -> list[Finding]:
        """The findings of the current (or last) fit, in the order they were reported."""
        return self.reporter.findings

    @property
    def notes(self) -> list[str]:
        """Informational lines of the current (or last) fit (e.g. the leakage check's summary or why it skipped)."""
        return self.reporter.notes

    @property
    def initial_loss_value(self) -> float | None:
        """The first batch's loss when the initial-loss check compared it, else ``None``."""
        return self._value("initial_loss", "initial_loss_value", None)

    @property
    def grad_norms(self) -> list[tuple[int, float]]:
        """(global step, total gradient norm before clipping) of the logged steps."""
        return self._value("grad_norm", "grad_norms", [])

    @property
    def data_wait_fractions(self) -> list[tuple[int, float]]:
        """(epoch, median fraction of step time spent waiting for data) per epoch."""
        return self._value("data_wait", "data_wait_fractions", [])

    @property
    def leakage_overlap(self) -> int | None:
        """Val samples identical to a train sample, ``None`` when the leakage check did not run."""
        return self._value("leakage", "leakage_overlap", None)

    def reported(self, check: str) -> bool:
        """Whether ``check`` has a finding in this fit."""
        return self.reporter.reported(check)

    # --- Lightning hooks: the doctor's own (every other hook is forwarded as it is, see ForwardingCallback) ------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._assemble()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for hook in self.hook_calls["on_train_end"]:
            hook(trainer, pl_module)
        self.reporter.summarize(trainer)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        timer = self._data_wait_timer
        if timer is not None:
            timer.wait_ended()
        for hook in self.hook_calls["on_train_batch_start"]:
            hook(trainer, pl_module, batch, batch_idx)
        if timer is not None:
            timer.step_started()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        timer = self._data_wait_timer
        if timer is not None:
            timer.step_ended()
        for hook in self.hook_calls["on_train_batch_end"]:
            hook(trainer, pl_module, outputs, batch, batch_idx)
        if timer is not None:
            timer.wait_started()


__all__ = ["FORWARDED_HOOKS", "LoopDoctor"]
