"""``MlflowModel``: the fitted model logged as an MLflow pyfunc model of the run at the end of a fit, optionally
registered (what is logged and how it is served: ``recipes.predict.model_logging``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from datamodules.recipe_contract import raw_examples_of
from recipes.predict.model_logging import MODEL_CODE, MODEL_TAG, checkpoint_and_best
from recipes.predict.predictions import predict_frame
from recipes.tracking.tracked_run import tracked_run


class MlflowModel(Callback):
    """Log the fitted model as an MLflow pyfunc model of the run at the end of a fit, optionally registered.

    Args:
        register_as: Register the model as a new version of this name in the Model Registry (``None``: log only).
    """

    def __init__(self, register_as: str | None = None) -> None:
        self.register_as = register_as
        self.model_uri: str | None = None
        self.version: str | None = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.interrupted:
            return
        run = tracked_run(trainer)
        checkpoint, best = checkpoint_and_best(trainer)
        if run is None or checkpoint is None:
            return
        datamodule = trainer.datamodule
        example = self.input_example(pl_module, datamodule)
        if example is None:  # the data module takes no raw rows (frame_data), so the model could not predict
            run.set_tag(MODEL_TAG, f"none: {type(datamodule).__name__} does not predict raw rows")
            return
        info = run.log_pyfunc_model(
            code_path=str(MODEL_CODE),
            artifacts={"checkpoint": checkpoint},
            model_config={
                "task_class": f"{type(pl_module).__module__}.{type(pl_module).__qualname__}",
                "data_class": f"{type(datamodule).__module__}.{type(datamodule).__qualname__}",
            },
            input_example=example,
            registered_model_name=self.register_as,
            best=best,
            uri_tag=MODEL_TAG,
        )
        self.model_uri, self.version = info
        if self.model_uri is None:  # the store failed (its one warning was printed): nothing more to write to it
            print("recipes: MLflow model not logged: the tracking store failed; it is kept in the run's checkpoint "
                  "folder (model/) and logged by `recipes sync` (or the next command that reads the store)",
                  file=sys.stderr)
            return
        run.set_tag(MODEL_TAG, self.model_uri)
        registered = f", registered as {self.register_as} version {self.version}" if self.version else ""
        print(f"recipes: MLflow model {self.model_uri} ({Path(checkpoint).name}){registered}", file=sys.stderr)

    @staticmethod
    def input_example(pl_module: pl.LightningModule, datamodule: Any) -> tuple[Any, Any] | None:
        """(raw rows, their predictions) for the model's signature, or ``None`` when the data has no raw rows."""
        frame = raw_examples_of(datamodule)
        if frame is None:
            return None
        return frame, predict_frame(pl_module, datamodule, frame)


__all__ = ["MlflowModel"]
