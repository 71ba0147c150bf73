"""A run's model as an MLflow 3 logged model, written through the run's own client.

``mlflow.pyfunc.log_model(name=...)`` does this through MLflow's global tracking URI; loopwise writes to the store of
its run's client instead (the global URI and ``MLFLOW_TRACKING_URI`` stay as the user set them), following the steps
of MLflow's ``Model.log``: a logged model created ``PENDING`` with the run as its source, the run's output linked to
it at a step, the metrics of that step linked to it (``Metric.model_id``), the pyfunc saved with the model's id in its
``MLmodel`` and uploaded as the model's artifacts, then ``READY`` (``FAILED`` when a step fails). Its URI is
``models:/<model id>``; a registered version's source is that URI and its ``model_id`` the model.
"""

from __future__ import annotations

import json
import tempfile
from typing import Any

from recipes.tracking.run_datasets import data_record

MODEL_URI_PREFIX = "models:/"


def best_step(client: Any, run_id: str, monitor: str, value: float) -> int | None:
    """The first step at which the run's metric ``monitor`` took ``value`` (the step a monitored checkpoint was
    saved at: a ``ModelCheckpoint`` replaces its best only on a strict improvement); ``None`` when no entry has it."""
    history = client.get_metric_history(run_id, monitor)
    matching = [m.step for m in history if abs(m.value - value) <= 1e-6 * max(1.0, abs(value))]
    return min(matching) if matching else None


def last_step(client: Any, run_id: str) -> int | None:
    """The newest step any metric of the run was logged at (``None``: the run has no metrics)."""
    steps = [m.step for key in client.get_run(run_id).data.metrics for m in client.get_metric_history(run_id, key)]
    return max(steps) if steps else None


def link_metrics_of_step(client: Any, run_id: str, model_id: str, step: int) -> dict[str, float]:
    """Link every metric the run logged at ``step`` to the logged model ``model_id`` (the same entries, with the
    model's id and, for a split's metric such as ``val/acc``, the run's dataset input of that split, which MLflow's
    UI lists as the model's "Datasets used": the run's history gains nothing; a metric logged twice at the step, as
    Lightning's ``epoch`` is, is linked once, its latest entry); the linked values by name."""
    from mlflow.entities import Metric  # noqa: PLC0415

    run = client.get_run(run_id)
    datasets = data_record(run)
    latest = {}
    for key in run.data.metrics:
        at_step = [m for m in client.get_metric_history(run_id, key) if m.step == step and m.model_id is None]
        if at_step:
            latest[key] = max(at_step, key=lambda m: m.timestamp)
    linked = []
    for m in latest.values():
        dataset_name, dataset_digest = datasets.get(m.key.split("/")[0], (None, None))
        linked.append(Metric(m.key, m.value, m.timestamp, m.step, model_id=model_id, run_id=run_id,
                             dataset_name=dataset_name, dataset_digest=dataset_digest))
    if linked:
        client.log_batch(run_id, metrics=linked)
    return {m.key: m.value for m in linked}


def log_logged_model(
    client: Any,
    run_id: str,
    name: str | None,
    step: int | None,
    tags: dict[str, str],
    save: Any,
) -> str:
    """Create the logged model ``name`` (``None``: the run's name, e.g. ``spiral_mlp-4e233b89``, so that MLflow's
    Models tab tells the models of an experiment apart) of run ``run_id`` and fill it: ``save(path, mlflow_model)``
    writes the MLflow model folder at ``path`` (an ``mlflow.models.Model`` carrying the logged model's ids is given to the flavour's
    ``save_model``). With ``step``, the run's output is the model at that step and the step's metrics are linked to
    it. Returns the model's id."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus  # noqa: PLC0415
    from mlflow.models import Model  # noqa: PLC0415

    run = client.get_run(run_id)
    model = client.create_logged_model(
        experiment_id=run.info.experiment_id, name=name or run.info.run_name or "model", source_run_id=run_id,
        tags=tags, params=dict(run.data.params),
    )
    try:
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=step or 0)])
        if step is not None:
            link_metrics_of_step(client, run_id, model.model_id, step)
        mlflow_model = Model(artifact_path=model.artifact_location, model_uuid=model.model_id, run_id=run_id,
                             model_id=model.model_id)  # fmt: skip
        with tempfile.TemporaryDirectory() as folder:
            save(f"{folder}/model", mlflow_model)
            client.log_model_artifacts(model.model_id, f"{folder}/model")
    except BaseException:
        try:
            client.finalize_logged_model(model.model_id, LoggedModelStatus.FAILED)
        except Exception:  # noqa: BLE001  (the store failed too: the first error is the one to see)
            pass
        raise
    client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    return model.model_id


def register_logged_model(client: Any, registered_name: str, model_id: str, run_id: str) -> str:
    """Register the logged model ``model_id`` as a new version of ``registered_name`` (created when missing), as
    ``mlflow.register_model("models:/<model id>", ...)`` does: the version's source is the model's URI (the open
    source registry keeps no ``model_id`` of its own: it reads the source) and the model's tag
    ``mlflow.modelVersions`` lists the version (the UI's link from the model to its versions). The version number."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS  # noqa: PLC0415

    try:
        client.create_registered_model(registered_name)
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version = client.create_model_version(
        registered_name, source=f"{MODEL_URI_PREFIX}{model_id}", run_id=run_id, model_id=model_id
    )
    listed = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS) or "[]")
    listed.append({"name": version.name, "version": version.version})
    client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(listed)})
    return str(version.version)


__all__ = ["MODEL_URI_PREFIX", "best_step", "last_step", "link_metrics_of_step", "log_logged_model",
           "register_logged_model"]
