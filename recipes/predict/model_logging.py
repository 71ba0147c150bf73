"""The trained model as an MLflow model: pyfunc flavour, signature, input example, optionally registered.

At the end of a finished fit, ``MlflowModel`` logs the run's best checkpoint (the last one when nothing is
monitored) as an MLflow pyfunc model of the run (``recipes/predict/pyfunc_model.py``: raw rows in, the columns of
``recipes predict`` out), with a signature and an input example taken from the data module's raw rows; with
``--register_model NAME`` it also becomes a new version of NAME in the tracking store's Model Registry (the
embedded SQLite store included). ``mlflow.pyfunc.load_model("models:/NAME/<version>")`` and
``mlflow models serve -m models:/NAME/<version> --env-manager local`` then predict without loopwise's config.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from recipes.tracking.registered_model_name import (  # noqa: F401  (re-exported: their place before issue 29)
    REGISTERED_MODEL_NAME_MAX,
    check_registered_model_name,
)
from datamodules.recipe_contract import raw_examples_of
from recipes.tracking.tracked_run import tracked_run

MODEL_CODE = Path(__file__).with_name("pyfunc_model.py")
MODEL_TAG = "loopwise.model_uri"


def checkpoint_to_log(trainer: pl.Trainer) -> str | None:
    """The best checkpoint of the fit (a monitored ``ModelCheckpoint``), else the newest one written."""
    return checkpoint_and_best(trainer)[0]


def checkpoint_and_best(trainer: pl.Trainer) -> tuple[str | None, tuple[str, float] | None]:
    """``checkpoint_to_log`` and, when it is a monitored best, (the monitored metric, its best value): the metrics
    of the step that reached it are the ones linked to the logged model."""
    callbacks = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
    for callback in callbacks:
        if callback.monitor and callback.best_model_path and Path(callback.best_model_path).exists():
            score = callback.best_model_score
            best = (callback.monitor, float(score)) if score is not None else None
            return callback.best_model_path, best
    for callback in callbacks:
        if callback.last_model_path and Path(callback.last_model_path).exists():
            return callback.last_model_path, None
    return None, None


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
        from recipes.predict.predictions import predict_frame

        return frame, predict_frame(pl_module, datamodule, frame)
