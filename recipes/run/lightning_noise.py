"""Lightning's output a recipe user cannot act on, filtered by the Lightning module that prints it.

- torch 2.13 deprecates ``LeafSpec``, which Lightning 2.6's ``lightning.pytorch.utilities._pytree`` builds on every
  step: that module's ``FutureWarning`` is ignored (the same deprecation raised from the user's code still prints).
- Evaluation restores weights only: the fit-time callbacks it lacks are irrelevant, so ``lightning.pytorch.trainer.
  call``'s "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint ..." is ignored.
- ``recipes.cli.main([...])`` called from Python with the arguments as a list: ``lightning.pytorch.cli``'s warning that
  ``args`` and a non-empty ``sys.argv`` (the calling program's) were both given is ignored (the list is the command).
- A streamed table's dataset (``StreamingTableDataset``) is iterable and has a length, its batches, split among the
  loader workers by the dataset itself: ``lightning.pytorch.utilities.data``'s "Your `IterableDataset` has `__len__`
  defined" is ignored.
- A table with fewer batches an epoch than ``log_every_n_steps``: ``lightning.pytorch.loops.fit_loop``'s "The number
  of training batches (N) is smaller than the logging interval" is ignored; the tasks log each train metric per epoch
  too, so the epoch lines and the run hold them.
- Lightning's INFO lines on its ``rank_zero`` logger that advertise other products (``💡 Tip: ...`` litlogger,
  litmodels) and that say it loads the train loader early to count the steps (the recipes' schedules ask for
  ``estimated_stepping_batches``) are dropped; its other lines (seed, devices, why the fit stopped) stay.

``quiet_lightning`` installs these (``RecipesCLI`` does when it is built; again changes nothing).
"""

from __future__ import annotations

import logging
import warnings

from recipes.tracking.quiet_mlflow import DropInfo

#: (category, message pattern, module pattern) of Lightning's warnings that say nothing to a recipe user
LIGHTNING_WARNINGS = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated", r"lightning\.pytorch\.utilities\._pytree"),
    (UserWarning, r"Be aware that when using `ckpt_path`, callbacks used to create", r"lightning\.pytorch\.trainer\.call"),
    # `recipes.cli.main([...])` in Python passes its arguments on purpose: LightningCLI's warning that args and a
    # non-empty sys.argv (the calling program's, e.g. pytest's) were both given is about a mistake it cannot be
    (UserWarning, r"LightningCLI's args parameter is intended to run from within Python", r"lightning\.pytorch\.cli"),
    # a streamed table's dataset has a length (its batches) and splits itself among the loader workers
    (UserWarning, r"Your `IterableDataset` has `__len__` defined", r"lightning\.pytorch\.utilities\.data"),
    # a small table has fewer batches an epoch than log_every_n_steps: the tasks log every train metric per epoch
    # as well (the epoch lines, the MLflow run), so nothing the warning speaks of is missing
    (UserWarning, r"The number of training batches \(\d+\) is smaller than the logging interval",
     r"lightning\.pytorch\.loops\.fit_loop"),
)
#: Lightning's logger for ``rank_zero_info`` and the starts of the INFO messages dropped from it
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
RANK_ZERO_NOTES = ("💡 Tip: ", "Loading `train_dataloader` to estimate number of stepping batches")
_DROP_NOTES = DropInfo(RANK_ZERO_NOTES)


def quiet_lightning() -> None:
    """Ignore ``LIGHTNING_WARNINGS`` (by category, message and Lightning's module) and drop ``RANK_ZERO_NOTES`` from
    Lightning's ``rank_zero`` logger; calling it again adds nothing."""
    for category, message, module in LIGHTNING_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    logger = logging.getLogger(RANK_ZERO_LOGGER)
    if _DROP_NOTES not in logger.filters:
        logger.addFilter(_DROP_NOTES)


__all__ = ["LIGHTNING_WARNINGS", "RANK_ZERO_LOGGER", "RANK_ZERO_NOTES", "quiet_lightning"]
