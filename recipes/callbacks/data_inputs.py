"""``DataInputs``: the splits a command uses, logged as MLflow dataset inputs (the records are
``recipes.tracking.dataset_inputs``': name, digest, source, schema and profile of each split)."""

from __future__ import annotations

import json
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from recipes.tracking.dataset_inputs import split_record, stage_splits
from recipes.tracking.run_datasets import CONTEXT_TAG
from recipes.tracking.tracked_run import tracked_run


class DataInputs(Callback):
    """Log the splits a command uses as MLflow dataset inputs (see ``recipes.tracking.dataset_inputs``); ``records``
    keeps them."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def log(self, trainer: pl.Trainer, stage: str) -> None:
        run = tracked_run(trainer)
        datamodule = getattr(trainer, "datamodule", None)
        if run is None or datamodule is None or not trainer.is_global_zero or self.records:
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag  # noqa: PLC0415

        self.records = [split_record(datamodule, split, ds) for split, ds in stage_splits(datamodule, stage).items()]
        inputs = [
            DatasetInput(
                Dataset(r["name"], r["digest"], r["source_type"], json.dumps(r["source"], default=str),
                        json.dumps(r["schema"]), json.dumps(r["profile"])),
                [InputTag(CONTEXT_TAG, r["context"])],
            )
            for r in self.records
        ]
        if inputs:
            run.log_inputs(inputs)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.log(trainer, "fit")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "validate":
            self.log(trainer, "validate")

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.log(trainer, "test")

    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.log(trainer, "predict")



__all__ = ["DataInputs"]
