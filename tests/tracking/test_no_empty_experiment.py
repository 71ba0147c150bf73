"""Issue 57: a command that fails before training leaves no empty experiment in the store. The experiment is made
(as a model-development experiment, ``mlflow.experimentKind``) when the run is about to be made in it, under the
SQLite store's lock, not when the command starts."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from recipes.cli import main
from recipes.tracking.experiment_kind import EXPERIMENT_KIND_TAG, MODEL_DEVELOPMENT
from recipes.tracking.sqlite_store import ensure_experiment
from tests.conftest import CONFIGS, SPIRAL


def test_a_fit_that_fails_before_training_leaves_no_experiment_and_the_next_one_makes_it(workdir):
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", str(CONFIGS / "tabular_mlp.yaml"), "--data.init_args.path", "missing.csv"])
    assert stop.value.code == 2
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    assert client.get_experiment_by_name("tabular_mlp") is None  # it was made (empty) before the fix
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1"])
    experiment = client.get_experiment_by_name("spiral_mlp")
    assert experiment.tags[EXPERIMENT_KIND_TAG] == MODEL_DEVELOPMENT  # made with its kind
    assert len(client.search_runs([experiment.experiment_id])) == 1


def test_ensure_experiment_makes_it_once(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    ensure_experiment(uri, "mine")
    made = client.get_experiment_by_name("mine")
    ensure_experiment(uri, "mine")  # found: left as it is
    assert client.get_experiment_by_name("mine").experiment_id == made.experiment_id
    assert made.tags[EXPERIMENT_KIND_TAG] == MODEL_DEVELOPMENT
