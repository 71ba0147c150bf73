"""A recipe against a real ``mlflow server`` process on 127.0.0.1 (SQLite backend, local artifact root), and the
fail-fast check for a server that does not answer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tests.conftest import SPIRAL, free_port
from tests.mlflow_server import MlflowServer
from recipes.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """``mlflow server`` on a free port of 127.0.0.1; yields (uri, server directory); stopped afterwards."""
    server = MlflowServer(tmp_path_factory.mktemp("server"))
    server.start()
    try:
        yield server.uri, server.root
    finally:
        server.stop()


@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_recipe_logs_everything_to_a_real_server(mlflow_server, workdir: Path, monkeypatch, capsys) -> None:
    from mlflow.tracking import MlflowClient

    uri, root = mlflow_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3"])

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("spiral_mlp")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.01"
    assert run.data.params["batch_size"] == "64"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")] == [21, 43, 65]
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "checkpoints"} <= names
    ckpts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert ckpts == {"checkpoints/best.ckpt", "checkpoints/last.ckpt"}
    # the files live in the server's artifact root, nothing was written to the local default store
    served = root / "artifacts"
    assert list(served.rglob("last.ckpt")) and list(served.rglob("config.yaml"))
    assert not (workdir / "mlflow.db").exists() and not (workdir / "mlruns").exists()
    # the uploaded last.ckpt is the final one (replaced during training)
    local_last = next((workdir / "checkpoints" / "spiral_mlp" / run.info.run_id).glob("last.ckpt"))
    uploaded = next(served.rglob("last.ckpt"))
    assert uploaded.read_bytes() == local_last.read_bytes()
    assert torch.load(uploaded, weights_only=True, map_location="cpu")["epoch"] == 2

    # the server's best checkpoint validates by run id, and compare reads the server
    capsys.readouterr()
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", f"mlflow:{run.info.run_id}/best"])
    best_logged = max(m.value for m in client.get_metric_history(run.info.run_id, "val/acc"))
    runs = client.search_runs([experiment.experiment_id], "tags.`loopwise.stage` = 'validate'")
    assert len(runs) == 1 and runs[0].data.metrics["val/acc"] == pytest.approx(best_logged)
    with pytest.raises(SystemExit) as done:
        main(["compare", "--experiment", "spiral_mlp", "--stage", "fit", "--format", "csv"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert run.info.run_id in out and "FINISHED" in out


@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_unreachable_server_fails_before_training(workdir: Path, monkeypatch, capsys) -> None:
    port = free_port()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    start = time.perf_counter()
    with pytest.raises(SystemExit) as done:
        main(["fit", "-c", str(SPIRAL)])
    assert done.value.code == 2
    assert time.perf_counter() - start < 60  # not minutes of MLflow retries
    err = capsys.readouterr().err
    assert f"recipes: error: the MLflow tracking server at http://127.0.0.1:{port} does not answer" in err
    assert "Connection refused" in err
    assert not (workdir / "checkpoints").exists()  # no training, no files
    assert not (workdir / "mlflow.db").exists()


@pytest.mark.fresh_store
def test_the_first_command_after_a_server_starts_waits_until_its_api_answers(tmp_path_factory, workdir: Path,
                                                                              monkeypatch, capsys) -> None:
    """Issue 53: a server just started answers ``/health`` while its API does not answer yet (its store still busy:
    here the test holds the server's SQLite store locked for a few seconds after ``/health`` answers). The command
    waits for the API (at most ``LOOPWISE_SERVER_WAIT_S`` seconds, 30 by default or when it is not a number) instead
    of failing at once."""
    import sqlite3
    import threading

    server = MlflowServer(tmp_path_factory.mktemp("fresh_server"))
    server.start()  # returns as soon as /health answers 200
    store = sqlite3.connect(server.root / "server.db", timeout=60, isolation_level=None, check_same_thread=False)
    try:
        store.execute("BEGIN EXCLUSIVE")  # the server's store answers nothing until this ends
        (workdir / "checkpoints").mkdir()
        sync = ["sync", "--checkpoints_dir", str(workdir / "checkpoints"), "--tracking_uri", server.uri]
        monkeypatch.setenv("LOOPWISE_SERVER_WAIT_S", "2")  # a bounded wait: then the usual line
        with pytest.raises(SystemExit) as done:
            main(sync)
        assert done.value.code == 2
        assert f"recipes: error: the MLflow tracking server at {server.uri} does not answer" in "".join(capsys.readouterr())
        monkeypatch.setenv("LOOPWISE_SERVER_WAIT_S", "soon")  # not a number: one warning, the default (30 s)
        release = threading.Timer(8.0, lambda: store.execute("COMMIT"))
        release.start()
        started = time.monotonic()
        with pytest.raises(SystemExit) as done:
            main(sync)
        waited = time.monotonic() - started
        release.join()
        out, err = capsys.readouterr()
        assert done.value.code == 0, out + err
        assert "does not answer" not in out + err and 6.0 < waited < 30.0
        # the line is printed once a probe fails while /health answers; on a loaded machine the first probe may
        # instead wait on the server's lock until it is released and succeed (no line): either way, no failure
        waiting = [line for line in err.splitlines() if line.startswith("recipes: waiting for")]
        assert len(waiting) <= 1 and all(f"the MLflow tracking server at {server.uri}: /health answers" in line
                                         for line in waiting), err
        assert "recipes: warning: LOOPWISE_SERVER_WAIT_S='soon' is not a number of seconds >= 0" in err
    finally:
        store.close()
        server.stop()
