"""The record as MLflow 3's UI shows it (issue 30, point 6): loopwise's experiments are model-development ones
(``mlflow.experimentKind``), and a fit's model is an MLflow logged model of its run, with the best checkpoint's
metrics linked to it, from which registered versions are made."""

from __future__ import annotations

import json

import mlflow
import pandas as pd
import pytest
import torch

from recipes.cli import main
from recipes.predict.model_logging import MODEL_TAG
from recipes.tracking.experiment_kind import EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT
from tests.conftest import SPIRAL, mlflow_client, runs_of, working_directory

TINY = ["--trainer.max_epochs", "4", "--trainer.limit_train_batches", "4", "--trainer.limit_val_batches", "2"]


@pytest.fixture(scope="module")
def registered(clean_workdir):
    """A 4-epoch spiral fit registered as `spiral`, in a fresh embedded store (loopwise creates the experiment)."""
    with clean_workdir("logged_model", store=False) as directory:
        main(["fit", "-c", str(SPIRAL), *TINY, "--register_model", "spiral"])
    return directory


def test_the_experiment_loopwise_creates_is_a_model_development_experiment(registered):
    experiment = mlflow_client(registered).get_experiment_by_name("spiral_mlp")
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_DEVELOPMENT == "custom_model_development"


def test_the_fit_logs_one_logged_model_linked_to_its_run_and_best_metrics_and_registers_it(registered):
    client = mlflow_client(registered)
    (run,) = runs_of(registered, "spiral_mlp")
    experiment_id = run.info.experiment_id
    (model,) = client.search_logged_models([experiment_id])
    assert model.source_run_id == run.info.run_id and str(model.status) == "READY"
    # named after its run (issue 57: MLflow's Models tab listed every model as "model")
    assert model.name == run.info.run_name == f"spiral_mlp-{run.info.run_id[:8]}"
    # the val metrics name the run's val dataset input: the model page's "Datasets used" (it showed None)
    (val_input,) = [i for i in run.inputs.dataset_inputs
                    if {t.key: t.value for t in i.tags}.get("mlflow.data.context") == "val"]
    linked_val = [m for m in model.metrics if m.key.startswith("val/")]
    assert linked_val and all((m.dataset_name, m.dataset_digest) == (val_input.dataset.name, val_input.dataset.digest)
                              for m in linked_val)
    assert all(m.dataset_name is None for m in model.metrics if m.key == "epoch")  # no split: no dataset
    assert run.data.tags[MODEL_TAG] == f"models:/{model.model_id}"
    assert [o.model_id for o in run.outputs.model_outputs] == [model.model_id]
    # the linked metrics are those of the step of the best checkpoint: its monitored value, its epoch
    best = torch.load(registered / "checkpoints" / "spiral_mlp" / run.info.run_id / "best.ckpt", weights_only=False)
    (state,) = [s for key, s in best["callbacks"].items() if "best" in key.lower() or s.get("monitor")]
    monitor, score = state["monitor"], float(state["best_model_score"])
    assert len({m.key for m in model.metrics}) == len(model.metrics)  # each metric linked once (epoch: twice a step)
    linked = {m.key: m for m in model.metrics}
    assert linked[monitor].value == pytest.approx(score, abs=1e-6)
    assert linked["epoch"].value == best["epoch"]
    history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, monitor)}
    assert monitor == "val/acc" and len(history) == 4  # the recipe keeps its best val/acc (mode max)
    assert linked[monitor].value == max(history.values()) and linked[monitor].step == min(
        step for step, value in history.items() if value == max(history.values()))  # fmt: skip
    assert history[linked[monitor].step] == linked[monitor].value
    # the run's own history gained nothing: one value per validation, as before
    assert len(client.get_metric_history(run.info.run_id, monitor)) == 4
    # the registered version points at the logged model
    # (MLflow's open-source registry stores no model_id column: a version names its logged model by its source, and
    # the model lists its versions in the tag mlflow.modelVersions, as mlflow.register_model leaves them)
    version = client.get_model_version("spiral", "1")
    assert version.source == f"models:/{model.model_id}" and version.run_id == run.info.run_id
    assert json.loads(client.get_logged_model(model.model_id).tags["mlflow.modelVersions"]) == [
        {"name": "spiral", "version": 1}]  # fmt: skip
    assert client.get_model_version_download_uri("spiral", "1") == model.artifact_location
    # the model keeps its code-path pyfunc, signature, input example and pinned requirements
    artifacts = {a.path for a in client.list_logged_model_artifacts(model.model_id)}
    assert {"MLmodel", "pyfunc_model.py", "input_example.json", "requirements.txt", "artifacts"} <= artifacts


def test_the_logged_model_and_the_registered_version_load_and_predict(registered):
    (run,) = runs_of(registered, "spiral_mlp")
    points = pd.DataFrame({"x": [0.0, 0.5, -0.7], "y": [0.1, -0.4, 0.8]})
    with working_directory(registered):
        mlflow.set_tracking_uri(f"sqlite:///{registered / 'mlflow.db'}")
        try:
            by_id = mlflow.pyfunc.load_model(run.data.tags[MODEL_TAG]).predict(points)
            by_version = mlflow.pyfunc.load_model("models:/spiral/1").predict(points)
        finally:
            mlflow.set_tracking_uri(None)
    assert list(by_id.columns) == ["row", "prediction", "prob_0", "prob_1", "prob_2"]
    assert by_id.equals(by_version)
    assert by_id[["prob_0", "prob_1", "prob_2"]].sum(axis=1).to_numpy() == pytest.approx([1.0] * 3, abs=1e-5)


def test_an_experiment_without_a_kind_gets_it_and_a_kind_already_set_is_kept(workdir):
    client = mlflow_client(workdir)
    client.create_experiment("made_by_hand")
    client.create_experiment("genai", tags={EXPERIMENT_KIND_TAG: "genai_development"})
    for name in ("made_by_hand", "genai"):
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "1", "--trainer.logger.init_args.experiment_name", name,
              "--mlflow_model", "false"])  # fmt: skip
    assert client.get_experiment_by_name("made_by_hand").tags[EXPERIMENT_KIND_TAG] == MODEL_DEVELOPMENT
    assert client.get_experiment_by_name("genai").tags[EXPERIMENT_KIND_TAG] == "genai_development"
