"""The trained model as an MLflow model: pyfunc flavour, signature, input example, optionally registered.

At the end of a finished fit, ``MlflowModel`` (``recipes.callbacks.mlflow_model``) logs the run's best checkpoint
(the last one when nothing is monitored) as an MLflow pyfunc model of the run (``recipes/predict/pyfunc_model.py``:
raw rows in, the columns of ``recipes predict`` out), with a signature and an input example taken from the data module's raw rows; with
``--register_model NAME`` it also becomes a new version of NAME in the tracking store's Model Registry (the
embedded SQLite store included). ``mlflow.pyfunc.load_model("models:/NAME/<version>")`` and
``mlflow models serve -m models:/NAME/<version> --env-manager local`` then predict without loopwise's config.
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from recipes.tracking.registered_model_name import (  # noqa: F401  (re-exported: their place before issue 29)
    REGISTERED_MODEL_NAME_MAX,
    check_registered_model_name,
)

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
