"""A training step's loss handed to Lightning's loggers, callback metrics and progress bar without ``self.log``.

Each ``self.log`` call walks the whole ``_ResultMetric`` it stores the value in (Lightning moves its every attribute
to the value's device, through ``apply_to_collection``): about 0.5 ms on a CPU per call, as much as a small network's
whole training step, paid on every step whose loss is read (the logging steps, each epoch's last batch). And the
result collection kept the last logged loss after its step, so every later batch of the epoch read it back to the
host again (its progress-bar value, ``.item()``): a host-device sync per ordinary batch on a GPU.

``TrainStepLogging`` puts the loss where ``self.log(name, loss, on_step=True, on_epoch=False, prog_bar=True)`` put it,
at the same moments: the callback and logged metrics in the training step (the callbacks' batch-end hooks read them),
the progress-bar value at the module's batch-end hook, and ``{name: value, "epoch": epoch}`` written to every logger
at the step Lightning writes the batch's step-level metrics at (``log_every_n_steps``, a stopping run; never on a
batch that accumulates gradients). The tensor is read back to the host once, at that hook, on those steps only.
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
        #: the loss of the epoch's last read step (``None`` before the epoch's first), its number once read back
        self.loss: Tensor | None = None
        self.value: float | None = None

    def start_epoch(self) -> None:
        """A training epoch starts: the previous epoch's loss is no longer this epoch's (Lightning reset it too)."""
        self.loss, self.value = None, None

    def step_read(self, trainer: Any, loss: Tensor) -> None:
        """A read step's loss (from the training step): in the trainer's callback and logged metrics now, as a
        tensor (nothing is read back here)."""
        self.loss, self.value = loss.detach(), None
        if trainer is not None:  # a training step called outside a Trainer shows nothing (self.log warned)
            show_step_value(trainer, self.name, value=self.loss)

    def batch_end(self, trainer: Any) -> None:
        """The module's ``on_train_batch_end``: a read step's loss is read back once and shown in the progress bar;
        when Lightning writes step-level metrics after this batch, it goes to every logger with the epoch, at
        Lightning's step (the last read step's loss, as Lightning wrote, when a run stops after a batch not read)."""
        if self.loss is None:
            return
        if self.value is None:  # this step's loss, not read back yet
            self.value = float(self.loss)
            show_step_value(trainer, self.name, bar=self.value)
        step = step_metrics_step(trainer)
        if step is None:
            return
        for logger in trainer.loggers:
            logger.log_metrics({self.name: self.value, "epoch": trainer.current_epoch}, step=step)
            logger.save()


__all__ = ["TrainStepLogging"]
