"""An evaluation (``validate``, ``test``, ``predict``) stopped from outside ends KILLED and says what was not saved.

``StopOnSignal`` covers ``fit``. During an evaluation Lightning's own handling left the run FAILED (SIGTERM) or FAILED
with exit code 1 (Ctrl+C), printed "last.ckpt saved" although nothing was, and a SIGTERM during ``predict`` was
ignored until the predictions were written. ``StopEvaluationOnSignal`` stops at once on SIGTERM or SIGINT (an
evaluation has nothing to save half-way), tells the loggers (``RecipeLogger.mark_killed``: the run ends KILLED) and
raises ``EvaluationStopped``, which ``recipes`` turns into one line and exit code 143 or 130.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from recipes.callbacks.stop_on_signal import SIGNAL_EXIT_CODES

HANDLED = (signal.SIGTERM, signal.SIGINT)


class EvaluationStopped(SIGTERMException):
    """A ``validate``/``test``/``predict`` run stopped by a signal (``code``: 143 or 130)."""

    def __init__(self, signal_name: str, stage: str) -> None:
        super().__init__(f"{stage} stopped by {signal_name}")
        self.signal_name = signal_name
        self.stage = stage
        self.code = SIGNAL_EXIT_CODES[signal_name]

    def describe(self) -> str:
        """What the user reads: which stage, which signal, and that nothing was saved."""
        unsaved = "no predictions were written" if self.stage == "predict" else "its metrics were not logged"
        return f"recipes: {self.stage} stopped by {self.signal_name} (run marked KILLED; {unsaved})"


class StopEvaluationOnSignal(Callback):
    """SIGTERM or SIGINT during ``validate``, ``test`` or ``predict`` stop it at once; the run ends KILLED."""

    def __init__(self) -> None:
        self._previous: dict[int, Any] = {}

    def _install(self, trainer: pl.Trainer) -> None:
        if trainer.state.fn == "fit" or threading.current_thread() is not threading.main_thread():
            return
        stage = str(getattr(trainer.state.fn, "value", trainer.state.fn))  # "validate", "test", "predict"

        def stop(signum: int, frame: Any) -> None:
            name = signal.Signals(signum).name
            for logger in trainer.loggers:
                mark_killed = getattr(logger, "mark_killed", None)
                if callable(mark_killed):
                    mark_killed(name)
            raise EvaluationStopped(name, stage)

        for signum in HANDLED:
            self._previous.setdefault(signum, signal.getsignal(signum))
            signal.signal(signum, stop)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install(trainer)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install(trainer)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._install(trainer)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if threading.current_thread() is threading.main_thread():
            self._restore()


__all__ = ["EvaluationStopped", "StopEvaluationOnSignal"]
