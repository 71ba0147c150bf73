"""A training step's loss handed to Lightning's loggers, callback metrics and progress bar without ``self.log``.

Each ``self.log`` call walks the whole ``_ResultMetric`` it stores the value in (Lightning moves its every attribute
to the value's device, through ``apply_to_collection``): about 0.5 ms on a CPU per call, as much as a small network's
whole training step, paid on every step whose loss is read (the logging steps, each epoch's last batch). And the
result collection kept the last logged loss after its step, so every later batch of the epoch read it back to the
host again (its progress-bar value, ``.item()``): a host-device sync per ordinary batch on a GPU.

``TrainStepLogging`` puts the loss where ``self.log(name, loss, on_step=True, on_epoch=False, prog_bar=True)`` put it,
from the training step of the steps whose values are read (``read_steps``): the callback and logged metrics, the
progress-bar value, and ``{name: value, "epoch": epoch}`` written to every logger at the step Lightning writes the
batch's step-level metrics at (``log_every_n_steps``, a stopping run; never on a batch that accumulates gradients).
The loss is read back to the host once, on those steps only (where ``self.log``'s progress-bar value read it too).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lightning_modules.compat import show_step_value, step_metrics_step


class TrainStepLogging:
    """The training loss of the steps whose values are read, shown and logged as a per-step ``self.log`` would.

    Args:
        name: The metric's name (``train/loss``).
    """

    def __init__(self, name: str = "train/loss") -> None:
        self.name = name
        #: the epoch's last read loss (``None`` before the epoch's first read step), its number, and the step it was
        #: written to the loggers at
        self.loss: Tensor | None = None
        self.value: float | None = None
        self.written: int | None = None

    def start_epoch(self) -> None:
        """A training epoch starts: the previous epoch's loss is no longer this epoch's (Lightning reset it too)."""
        self.loss, self.value, self.written = None, None, None

    def step_read(self, trainer: Any, loss: Tensor) -> None:
        """A read step's loss, from the training step: read back once, put in the trainer's callback, logged and
        progress-bar metrics (the callbacks' batch-end hooks read them), and written to every logger with the epoch
        when Lightning writes this batch's step-level metrics, at Lightning's step."""
        self.loss = loss.detach()
        if trainer is None:  # a training step called outside a Trainer shows nothing (self.log warned)
            return
        self.value = float(self.loss)
        show_step_value(trainer, self.name, value=self.loss, bar=self.value)
        step = step_metrics_step(trainer)
        if step is not None:
            self._write(trainer, step)

    def batch_end(self, trainer: Any) -> None:
        """The module's ``on_train_batch_end``: a run asked to stop during a batch that was not read has its step
        metrics written by Lightning after it, with the epoch's last read loss (as ``self.log`` left it)."""
        if not trainer.should_stop or self.value is None:
            return
        step = step_metrics_step(trainer)
        if step is not None and step != self.written:
            self._write(trainer, step)

    def _write(self, trainer: Any, step: int) -> None:
        for logger in trainer.loggers:
            logger.log_metrics({self.name: self.value, "epoch": trainer.current_epoch}, step=step)
            logger.save()
        self.written = step


__all__ = ["TrainStepLogging"]
