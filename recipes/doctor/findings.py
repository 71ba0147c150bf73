"""How the loop doctor's checks report: ``Finding``, ``LoopDoctorWarning`` and the shared ``FindingsReporter``.

Every finding is kept in the reporter's ``findings``, warned once per check (the checks ask ``reported`` before they
report again) and, with an MLflow logger, set as the run tag ``doctor.<check>``. A check that stops the run also sets
``doctor.failure``. Series go to every logger of the trainer (``doctor/grad_norm``, ...), and at the end of training
the tag ``doctor.findings`` lists the checks that found something ("none" for a clean run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from recipes.tracking.tracked_run import tracked_run

# MLflow keeps tag values short: longer messages are cut to this many characters
TAG_LIMIT = 500
# the checks' names, in the order the tag ``doctor.findings`` and the summary list them
CHECKS = ("initial_loss", "non_finite", "grad_norm", "data_wait", "leakage", "schedule", "mode", "unused_parameters", "baseline")


class LoopDoctorWarning(UserWarning):
    """A finding of the loop doctor."""


@dataclass(frozen=True)
class Finding:
    """One problem the loop doctor found: which check, what it says, and when (optimizer step, epoch)."""

    check: str
    message: str
    step: int
    epoch: int


class FindingsReporter:
    """Where the loop doctor's checks report: the ``findings`` and ``notes`` of one fit, warnings, tags and series.

    ``LoopDoctor`` gives one reporter to all its checks; a check used on its own has a reporter of its own. Tags are
    written to the trainer's MLflow logger (if any) on rank 0; series to every logger of the trainer on rank 0.
    """

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.notes: list[str] = []

    def reset(self) -> None:
        """Forget the findings and notes of a previous fit."""
        self.findings = []
        self.notes = []

    def reported(self, check: str) -> bool:
        """Whether ``check`` has a finding in this fit."""
        return any(f.check == check for f in self.findings)

    def report(
        self,
        trainer: pl.Trainer,
        check: str,
        message: str,
        warn: bool = True,
        step: int | None = None,
        epoch: int | None = None,
    ) -> None:
        """Keep a finding of ``check``, warn it (``LoopDoctorWarning``) and set it as the tag ``doctor.<check>``.
        ``step``/``epoch``: when the finding happened (default: now; a step read later names its own)."""
        step = trainer.global_step if step is None else step
        epoch = trainer.current_epoch if epoch is None else epoch
        self.findings.append(Finding(check, message, step, epoch))
        if warn:
            rank_zero_warn(f"LoopDoctor [{check}]: {message}", category=LoopDoctorWarning)
        self.set_tag(trainer, f"doctor.{check}", message)

    def fail(
        self,
        trainer: pl.Trainer,
        check: str,
        error: type[Exception],
        message: str,
        step: int | None = None,
        epoch: int | None = None,
    ) -> NoReturn:
        """Report a finding that stops the run: kept and tagged (not warned), tag ``doctor.failure``, ``error`` raised."""
        self.report(trainer, check, message, warn=False, step=step, epoch=epoch)
        self.set_tag(trainer, "doctor.failure", message)
        raise error(message)

    def set_tag(self, trainer: pl.Trainer, key: str, value: str) -> None:
        """Set an MLflow run tag (cut to ``TAG_LIMIT`` characters) where the trainer has an MLflow logger."""
        run = tracked_run(trainer)
        if run is not None and trainer.is_global_zero:
            run.set_tag(key, value[:TAG_LIMIT])

    def log_metric(self, trainer: pl.Trainer, name: str, value: float, step: int | None = None) -> None:
        """Log one value of the series ``name`` at ``step`` (default: the trainer's global step) to every logger
        (rank 0 only)."""
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({name: value}, step=trainer.global_step if step is None else step)

    def note(self, trainer: pl.Trainer, line: str) -> None:
        """Keep an informational line in ``notes`` and print it (rank 0 only): no finding, no warning."""
        self.notes.append(line)
        if trainer.is_global_zero:
            print(f"LoopDoctor: {line}", flush=True)

    def summarize(self, trainer: pl.Trainer) -> None:
        """At the end of training: the tag ``doctor.findings`` and a one-line verdict."""
        checks = sorted({f.check for f in self.findings}, key=CHECKS.index)
        self.set_tag(trainer, "doctor.findings", ",".join(checks) or "none")
        summary = "no findings" if not checks else f"{len(self.findings)} finding(s): {', '.join(checks)}"
        if trainer.is_global_zero:
            print(f"LoopDoctor: {summary}", flush=True)


__all__ = ["CHECKS", "TAG_LIMIT", "Finding", "FindingsReporter", "LoopDoctorWarning"]
