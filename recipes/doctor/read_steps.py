"""Which training steps have their values read back to the host by the loop doctor.

The doctor keeps each step's device-side flags on the device and reads them where a per-step read would have been
seen anyway: the steps whose values Lightning writes to the loggers (every ``log_every_n_steps``), the epoch's last
batch, a run that is stopping, and the run's last step (``lightning_modules.read_steps.ends_epoch_values``).
"""

from __future__ import annotations

from typing import Any

from lightning_modules.read_steps import ends_epoch_values
from recipes.compat.internals import is_logging_step


def is_read_step(trainer: Any) -> bool:
    """Whether the training batch in progress is a step whose values are read back: a logging step, the epoch's last
    batch, a stopping run or the run's last step. The same answer from ``on_train_batch_start`` to the optimizer
    step of that batch."""
    return is_logging_step(trainer) or ends_epoch_values(trainer)


__all__ = ["is_read_step"]
