"""An evaluation run linked to the training run that produced its checkpoint.

A ``validate``, ``test`` or ``predict`` run of a checkpoint stamped with its fit run (``run_continuity``) gets the
tag ``loopwise.fit_run_id`` (and ``loopwise.fit_run_name``) and, when that run is in the same tracking store, the
fit run's params: a test score then sits beside the hyperparameters that produced it (``recipes compare --stage
all``), without opening the training run.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from recipes.tracking.tracked_run import tracked_run

FIT_RUN_TAG = "loopwise.fit_run_id"


def fit_run_of(stamp: dict[str, str], tracking_uri: str) -> Any | None:
    """The MLflow run a checkpoint's stamp names, when this store has it."""
    run_id = stamp.get("mlflow_run_id")
    if not run_id:
        return None
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    try:
        return MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException:
        return None


def link_evaluation_run(trainer: pl.Trainer, stamp: dict[str, str], tracking_uri: str) -> dict[str, str]:
    """Tag the evaluation run with its fit run and copy the fit run's params into it; returns the tags written."""
    run = tracked_run(trainer)
    if run is None or not stamp.get("mlflow_run_id") or not trainer.is_global_zero:
        return {}
    tags = {FIT_RUN_TAG: stamp["mlflow_run_id"]}
    fit = fit_run_of(stamp, tracking_uri)
    if fit is not None:
        tags["loopwise.fit_run_name"] = fit.info.run_name or ""
        run.log_params_once(dict(fit.data.params))
    for key, value in tags.items():
        run.set_tag(key, value)
    return tags


__all__ = ["FIT_RUN_TAG", "fit_run_of", "link_evaluation_run"]
