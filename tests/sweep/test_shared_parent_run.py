"""Several workers of one sweep write the same runs: what one writes never fails another (``tests.insert_race``:
the other worker's insert lands between MLflow's lookup of a tag and this worker's insert of it)."""

from __future__ import annotations

import socket
import subprocess

import optuna
import pytest
from mlflow.tracking import MlflowClient

from recipes.sweep.study import record_progress
from recipes.tracking.abandoned_runs import ABANDONED_TAG, HOST_TAG, PID_TAG, close_abandoned_runs
from tests.conftest import copy_migrated_store
from tests.insert_race import another_writer_inserts_first


@pytest.fixture
def store(tmp_path, migrated_store) -> tuple[str, MlflowClient, str]:
    uri = f"sqlite:///{copy_migrated_store(migrated_store, tmp_path)}"
    client = MlflowClient(uri)
    return uri, client, client.create_experiment("e")


def test_two_workers_writing_the_parent_summary_at_the_same_moment_both_succeed(store):
    """Every worker writes the parent's ``best.*`` tags after each trial; two finishing a trial together met in the
    gap (``test_two_workers_share_one_study_and_one_parent_run``: once in CI, 1 in 19 local runs under load), and
    one worker ended with exit code 1."""
    uri, client, experiment_id = store
    parent = client.create_run(experiment_id).info.run_id
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))
        study.optimize(lambda t: t.suggest_float("lr", 0.0, 1.0) + t.suggest_int("layers", 1, 4), n_trials=3)
    finally:
        optuna.logging.set_verbosity(verbosity)
    with another_writer_inserts_first(uri, parent, "best.") as raced:
        record_progress(study, client, parent)
    assert raced == ["best.layers"]
    run = client.get_run(parent)
    assert {k: v for k, v in run.data.tags.items() if k.startswith("best.")} == {
        f"best.{key}": str(value) for key, value in study.best_params.items()}
    assert run.data.tags["loopwise.sweep.best_trial"] == str(study.best_trial.number)
    assert run.data.metrics["best_value"] == pytest.approx(study.best_value)
    assert run.data.metrics["trials_complete"] == 3.0 and run.data.metrics["trials_failed"] == 0.0
    assert any(key.startswith("importance/") for key in run.data.metrics)
    assert [(m.step, m.value) for m in client.get_metric_history(parent, "trials_complete")] == [(3, 3.0)]


def test_two_commands_closing_one_abandoned_run_at_the_same_moment_both_succeed(store):
    """Workers of a sweep started together after a ``kill -9`` each close the dead worker's runs when they start."""
    uri, client, experiment_id = store
    dead = subprocess.Popen(["true"])
    dead.wait()
    run_id = client.create_run(experiment_id, tags={HOST_TAG: socket.gethostname(), PID_TAG: str(dead.pid)}).info.run_id
    with another_writer_inserts_first(uri, run_id, ABANDONED_TAG) as raced:
        assert close_abandoned_runs(uri, "e") == [run_id]
    assert raced == [ABANDONED_TAG]
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and f"process {dead.pid} on" in run.data.tags[ABANDONED_TAG]
