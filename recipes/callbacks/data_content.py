"""``DataContent``: the data's content digests written into every checkpoint of a fit, and the evaluated split
compared with the checkpoint's after setup (what the digests are and why: ``recipes.checkpoints.data_content``)."""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn

from datamodules.recipe_contract import predicts_new_data, split_datasets_of
from recipes.callbacks.data_inputs import DataInputs
from recipes.checkpoints.data_content import DATA_KEY, SPLIT_TAG, SPLITS
from recipes.tracking.dataset_inputs import data_source, dataset_tensors, split_record
from recipes.tracking.tracked_run import tracked_run

EVALUATED_SPLIT = {TrainerFn.VALIDATING: "val", TrainerFn.TESTING: "test", TrainerFn.PREDICTING: "test"}


def logged_records(trainer: pl.Trainer) -> dict[str, dict[str, Any]]:
    """The split records the run's ``DataInputs`` callback made already (by split), so none is hashed twice."""
    for callback in trainer.callbacks:
        for member in getattr(callback, "members", [callback]):
            if isinstance(member, DataInputs):
                return {r["context"]: r for r in member.records}
    return {}


def split_digests(trainer: pl.Trainer, datamodule: Any, splits: tuple[str, ...]) -> dict[str, str]:
    """The digest of each of ``splits`` the data module has, as its MLflow dataset input has it."""
    datasets = dict(split_datasets_of(datamodule) or {})
    logged = logged_records(trainer)
    found = {}
    for split in splits:
        if split in logged:
            found[split] = str(logged[split]["digest"])
        elif split in datasets:
            found[split] = str(split_record(datamodule, split, datasets[split])["digest"])
    return found


def data_content(trainer: pl.Trainer, datamodule: Any) -> dict[str, Any]:
    """``{"source": <digest or None>, "splits": {split: digest}}`` of the data module after setup."""
    source_type, source, _ = data_source(datamodule)
    return {
        "source": source.get("source_digest") if source_type == "local" else None,
        "splits": split_digests(trainer, datamodule, SPLITS),
    }


class DataContent(Callback):
    """Write the data's content digests into every checkpoint of a fit; compare the evaluated split with the
    checkpoint's after setup (see ``recipes.checkpoints.data_content``).

    Args:
        check_splits: Compare the evaluated split's digest with the checkpoint's (``False`` when the evaluation was
            allowed on other data, whose splits differ by design).
    """

    def __init__(self, check_splits: bool = True) -> None:
        self.check_splits = check_splits
        self.content: dict[str, Any] | None = None  # this fit's, written into its checkpoints
        self.trained: dict[str, Any] | None = None  # the evaluated checkpoint's

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        datamodule = getattr(trainer, "datamodule", None)
        self.content = data_content(trainer, datamodule) if datamodule is not None else None

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.content is not None:
            checkpoint[DATA_KEY] = {"source": self.content["source"], "splits": dict(self.content["splits"])}

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        saved = checkpoint.get(DATA_KEY)
        self.trained = saved if isinstance(saved, dict) and trainer.state.fn != TrainerFn.FITTING else None

    def compare_split(self, trainer: pl.Trainer) -> None:
        """Warn and tag once when the evaluated split's content is not the checkpoint's."""
        datamodule = getattr(trainer, "datamodule", None)
        trained, self.trained = self.trained, None  # once per command
        split = EVALUATED_SPLIT.get(trainer.state.fn)
        if not (self.check_splits and trained and split and datamodule is not None and trainer.is_global_zero):
            return
        if trainer.state.fn == TrainerFn.PREDICTING and predicts_new_data(datamodule):
            return
        if dataset_tensors((split_datasets_of(datamodule) or {}).get(split)) is None:
            return  # no tensors: its digest is the source's and the settings', which the data guard compared
        was = (trained.get("splits") or {}).get(split)
        now = split_digests(trainer, datamodule, (split,)).get(split)
        if not was or not now or was == now:
            return
        print(
            f"recipes: warning: the {split} split's content differs from the one this checkpoint was trained "
            f"against (digest {was[:8]} vs {now[:8]}) although its source and data settings are the same: the data "
            "module's preprocessing changed since; scores may not be comparable with the training run's",
            file=sys.stderr,
        )
        run = tracked_run(trainer)
        if run is not None:
            run.set_tag(SPLIT_TAG, f"{split}: {was} -> {now}")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.VALIDATING:
            self.compare_split(trainer)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.compare_split(trainer)

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.compare_split(trainer)


__all__ = ["DataContent", "data_content", "split_digests"]
