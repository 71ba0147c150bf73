"""The train loader's position in the epoch, which Lightning 2.6 drops on resume when the schedule is sized early.

Lightning saves the ``state_dict()`` of a stateful train loader (loopwise's ``ResumableDataLoader``: the epoch and
the batches handed to the loop) in the fit loop's checkpoint state, and ``FitLoop.setup_data`` loads it back into
the loader it builds, but only when it runs after the loops are restored. Reading
``trainer.estimated_stepping_batches`` in ``configure_optimizers`` (what ``WarmupCosine`` and ``OneCycle`` need, and
the loop doctor's schedule check at fit start) builds the train loader earlier, before the checkpoint's loop state
is read; the later ``setup_data`` finds a loader and returns, so the saved position is never loaded and the
resumed epoch restarts at its first batch, with no warning (Lightning issue 20550).
``LoaderPositionOnResume`` loads the saved states into the train loaders at ``on_train_start``, when the loops are
restored and no batch has been fetched.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from recipes.compat.internals import saved_train_loader_states


def stateful_train_loaders(trainer: pl.Trainer) -> list[Any]:
    """The train loaders with ``state_dict`` and ``load_state_dict``, in the order Lightning saves their states."""
    if trainer.train_dataloader is None:
        return []
    flat = CombinedLoader(trainer.train_dataloader, "max_size_cycle").flattened
    return [d for d in flat if callable(getattr(d, "state_dict", None)) and callable(getattr(d, "load_state_dict", None))]


class LoaderPositionOnResume(Callback):
    """Load the train loaders' states saved in the checkpoint of a resumed fit, whether or not Lightning did (it
    did not when the train loader was built before the loops were restored). Loading a state twice is loading it
    once (``ResumableDataLoader.load_state_dict``), and only a restarting fit loads it, as in Lightning.

    Works with a plain ``lightning.Trainer`` too.
    """

    def __init__(self) -> None:
        self.states: list[Any] = []

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        self.states = saved_train_loader_states(checkpoint)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        states, self.states = self.states, []
        if not states or not trainer.fit_loop.restarting:
            return
        loaders = stateful_train_loaders(trainer)
        if len(loaders) != len(states):
            warnings.warn(
                f"LoaderPositionOnResume: the checkpoint holds {len(states)} train loader state(s) but the fit has "
                f"{len(loaders)} stateful train loader(s); the epoch's data restarts at its first batch",
                stacklevel=2,
            )
            return
        for loader, state in zip(loaders, states):
            loader.load_state_dict(state)


__all__ = ["LoaderPositionOnResume", "stateful_train_loaders"]
