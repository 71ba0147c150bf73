"""Two recipes started at the same moment on one embedded SQLite store both finish and are recorded in full."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from recipes.tracking.sqlite_store import prepare_sqlite_store, sqlite_database_path
from tests.conftest import SPIRAL, mlflow_client, runs_of
from tests.preloaded_python import preloaded_popen


def test_sqlite_database_path():
    assert sqlite_database_path("sqlite:////tmp/x/mlflow.db") == Path("/tmp/x/mlflow.db")
    assert sqlite_database_path("sqlite:///:memory:") is None
    assert sqlite_database_path("http://127.0.0.1:5000") is None
    assert sqlite_database_path("postgresql://u@h/db") is None


@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_prepare_sqlite_store_from_threads_creates_one_experiment(workdir):
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    errors: list[BaseException] = []

    def prepare() -> None:
        try:
            prepare_sqlite_store(uri, "together")
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=prepare) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    names = [e.name for e in mlflow_client(workdir).search_experiments()]
    assert names.count("together") == 1


@pytest.mark.slow
@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_two_recipes_at_once_on_one_sqlite_store_both_finish_in_full(workdir):
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    common = [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3"]
    common += ["--trainer.limit_train_batches", "10", "--trainer.log_every_n_steps", "2"]
    variants = {"0.01": ["--seed_everything", "0"], "0.003": ["--seed_everything", "1"]}
    procs = {
        lr: preloaded_popen(
            [*common, *extra, "--model.init_args.optimizer.init_args.lr", lr],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for lr, extra in variants.items()
    }  # started together: both find no mlflow.db
    outputs = {lr: proc.communicate(timeout=300)[0] for lr, proc in procs.items()}
    for lr, proc in procs.items():
        assert proc.returncode == 0, outputs[lr][-3000:]
        assert "database is locked" not in outputs[lr]

    runs = runs_of(workdir, "spiral_mlp")
    # the same check as before, with what a rare failure (a run with no params or metrics, left RUNNING) needs to be
    # understood: every run's state in the store and both processes' whole output
    found = [(r.info.run_id, r.info.status, len(r.data.params), len(r.data.metrics)) for r in runs]
    assert sorted(r.data.params.get("lr", "<none>") for r in runs) == ["0.003", "0.01"], (
        f"runs (id, status, params, metrics): {found}\n"
        + "\n".join(f"=== the process with lr {lr}:\n{out[-6000:]}" for lr, out in outputs.items())
    )
    client = mlflow_client(workdir)
    for run in runs:
        run_id = run.info.run_id
        assert run.info.status == "FINISHED"
        assert run.data.params["seed"] == ("0" if run.data.params["lr"] == "0.01" else "1")
        assert run.data.params["plan.total_optimizer_steps"] == "30"
        assert [m.step for m in sorted(client.get_metric_history(run_id, "val/acc"), key=lambda m: m.step)] == [
            9,
            19,
            29,
        ]
        assert len(client.get_metric_history(run_id, "train/loss")) == 15  # every 2nd of 30 steps
        assert len(client.get_metric_history(run_id, "lr/decay")) == 15
        top = {a.path for a in client.list_artifacts(run_id)}
        assert "config.yaml" in top
        assert {a.path for a in client.list_artifacts(run_id, "checkpoints")} == {
            "checkpoints/best.ckpt",
            "checkpoints/last.ckpt",
        }
        assert (workdir / "checkpoints" / "spiral_mlp" / run_id / "last.ckpt").is_file()
