"""The kind of the MLflow experiments loopwise writes to: model development, not GenAI.

MLflow's UI (3.x before 3.17) opens an experiment whose tag ``mlflow.experimentKind`` is unset in its GenAI layout (an
overview of traces, runs listed as "Evaluation runs"); ``custom_model_development`` opens the runs table with its Model
column and the model pages. MLflow 3.17's UI decides by its sidebar's "GenAI / Model training" switch instead (kept in
the browser's local storage, default GenAI; the query parameter ``workflowType=machine_learning`` sets it), so the
tag only records the kind there. Experiments loopwise creates carry the tag from the start; an existing experiment
that has no kind (one made by hand, by ``mlflow.set_experiment``, or by an older loopwise) gets it when a fit writes
to it; a kind already set, by the user or in the UI, is left as it is.
"""

from __future__ import annotations

from typing import Any

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow's tag (its UI's ExperimentKind values)
MODEL_DEVELOPMENT = "custom_model_development"


def create_experiment(client: Any, name: str) -> str:
    """Create the experiment ``name`` as a model-development experiment; its id."""
    return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: MODEL_DEVELOPMENT})


def mark_model_development(client: Any, experiment_id: str) -> bool:
    """Give the experiment the model-development kind when it has no kind; whether it was set now."""
    if EXPERIMENT_KIND_TAG in client.get_experiment(experiment_id).tags:
        return False
    client.set_experiment_tag(experiment_id, EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT)
    return True


def mark_experiment_kind(client: Any, experiment_id: str) -> None:
    """``mark_model_development`` for a fit's experiment, where a store that refuses it (no permission to edit the
    experiment, a server gone) changes nothing: the kind only lays out MLflow's UI, never a reason to stop a fit."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    try:
        mark_model_development(client, experiment_id)
    except MlflowException:
        pass


__all__ = ["EXPERIMENT_KIND_TAG", "MODEL_DEVELOPMENT", "create_experiment", "mark_experiment_kind",
           "mark_model_development"]
