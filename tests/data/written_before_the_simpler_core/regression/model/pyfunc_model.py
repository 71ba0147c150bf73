"""The MLflow pyfunc model of a loopwise run, logged as "model from code": MLflow copies this file into the model,
and ``mlflow.pyfunc.load_model`` runs it (no pickled Python object is stored or loaded).

The model's artifacts hold the run's best checkpoint; its ``model_config`` names the task class and the data module
class (written by loopwise when the model is logged, ``recipes/predict/model_logging.py``). ``predict`` takes raw rows as
the data module reads them (a DataFrame of raw table columns for ``TabularDataModule``) and returns the columns of
``recipes predict``'s CSV (``row``, ``prediction``, ``prob_<class>``). Loading needs loopwise installed (and the
network's module importable), as ``mlflow models serve --env-manager local`` has.

Bad input (a feature column missing, a NaN or a text in a numeric column, an unreadable image path) is refused by
the data module's own checks; ``predict`` raises their message as one line in an ``MlflowException`` with
``INVALID_PARAMETER_VALUE``, which MLflow's scoring server answers with HTTP 400 (no traceback).
"""

from __future__ import annotations

import importlib
from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE
from lightning.pytorch import LightningDataModule, LightningModule

from recipes.checkpoints.files import load_checkpoint_weights_only
from recipes.predict.predictions import predict_frame


def named_class(path: str, base: type) -> type:
    """The class at ``path`` ("package.module.Class"), which must be a subclass of ``base``."""
    module, _, name = str(path).rpartition(".")
    cls = getattr(importlib.import_module(module), name, None) if module else None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"loopwise model: {path!r} is not a {base.__name__} subclass")
    return cls


class LoopwiseModel(mlflow.pyfunc.PythonModel):
    """A trained task with the data module's training-time preprocessing: raw rows in, predictions out."""

    def load_context(self, context: Any) -> None:
        config = context.model_config
        checkpoint_path = context.artifacts["checkpoint"]
        task_class = named_class(config["task_class"], LightningModule)
        data_class = named_class(config["data_class"], LightningDataModule)
        checkpoint = load_checkpoint_weights_only(checkpoint_path)
        self.task = task_class.load_from_checkpoint(checkpoint_path, map_location="cpu", weights_only=True)
        self.task.eval()
        settings = dict(checkpoint.get("datamodule_hyper_parameters") or {})
        # LightningCLI adds "_class_path" and "_instantiator" to the saved arguments
        self.datamodule = data_class(**{k: v for k, v in settings.items() if not k.startswith("_")})
        state = checkpoint.get(data_class.__qualname__)
        if state:
            self.datamodule.load_state_dict(state)

    def predict(self, context, model_input: pd.DataFrame, params=None):  # type: ignore[no-untyped-def]
        """Predictions of raw rows (a pandas DataFrame), one output row per input row, in order.

        (``pd.DataFrame`` is a hint MLflow infers no schema from and validates nothing by, as intended: the signature
        logged with the model describes the columns and the data module checks them; without any hint MLflow warns
        "Add type hints to the `predict` method" each time the model is logged, and a hint such as ``Any`` it reads
        as a schema.)"""
        try:
            return predict_frame(self.task, self.datamodule, model_input)
        except (ValueError, TypeError, KeyError, OSError) as error:  # the data module's checks of the raw rows
            raise input_error(error) from None


def input_error(error: BaseException) -> MlflowException:
    """The data module's complaint about the input rows as one line, an ``MlflowException`` with
    ``INVALID_PARAMETER_VALUE`` (HTTP 400 from MLflow's scoring server)."""
    text = " ".join(str(error.args[0] if isinstance(error, KeyError) and error.args else error).split())
    return MlflowException(f"loopwise model: bad input: {text}", error_code=INVALID_PARAMETER_VALUE)


mlflow.models.set_model(LoopwiseModel())
