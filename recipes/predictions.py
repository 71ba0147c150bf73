"""The import path ``recipes.predictions`` that every MLflow model logged before the move imports (its copy of ``pyfunc_model.py``).

The module now lives in ``recipes.predict.predictions``; its CSV writer in
``recipes.callbacks.prediction_csv_writer``."""

from recipes.callbacks.prediction_csv_writer import PredictionCsvWriter  # noqa: F401
from recipes.predict.predictions import (  # noqa: F401
    prediction_table,
    gather_in_sample_order,
    predict_frame,
)

__all__ = [
    "prediction_table",
    "PredictionCsvWriter",
    "gather_in_sample_order",
    "predict_frame",
]
