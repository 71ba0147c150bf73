"""A team's day on the real components (issue 30, point 7): a PostgreSQL server (``tests/postgres_server.py``), an
``mlflow server`` whose backend store is a PostgreSQL database (its own artifact destination), and three working
directories sharing it through ``MLFLOW_TRACKING_URI=http://...``:

1. A fits the spiral and is stopped by SIGTERM in its third epoch (exit 143, the run KILLED). The monitored metric is
   ``val/acc`` with mode ``min`` (``team_runs.WORSE_LATER``): epoch 1 is the run's best, every later epoch worse.
2. B, which never trained, continues the same run with ``--ckpt_path mlflow:<id>/last``; the server is killed
   (SIGKILL) in the middle of B's fit and started again on the same port and PostgreSQL store. B's loop never waits on
   it, one warning line, the run catches up by itself and ends FINISHED with every validation; its best.ckpt (here,
   in the store, in the logged model) is still epoch 1, and the resume line says so.
3. C, which never trained, finds the run with ``recipes test --ckpt_path best`` (run, user@host, epoch, value).
4. A runs ``recipes sync`` twice: its stale journal (KILLED) changes nothing in the run's record or artifacts.
"""

from __future__ import annotations

import getpass
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recipes.cli import main
from recipes.tracking.journal import JOURNAL_NAME
from recipes.tracking.sync import main as sync_main
from tests.preloaded_python import preloaded_popen, preloaded_run
from tests.conftest import SPIRAL, recipes_env
from tests.mlflow_server import MlflowServer
from tests.postgres_server import PostgresServer
from tests.team_runs import (
    AFTER_BACK_ENV,
    EPOCH_PAUSE_ENV,
    SERVER_BACK_MARKER_ENV,
    WORSE_LATER,
    TimedLines,
    away_until_the_fit_notices,
    best_of,
    record_of,
)

EXPERIMENT = "spiral_mlp"
SMALL = ["-c", str(SPIRAL), "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
         "--system_metrics_interval", "0", *WORSE_LATER]
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+\s+step (\d+)\s")
OUTAGE_S = 3  # the server is away at least this long and until the fit meets the outage, plus its restart


def recipes(directory: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return preloaded_run([sys.executable, "-m", "recipes", *args], cwd=directory, env=env, timeout=300)


def artifacts_of(client, run_id: str, folder: str) -> dict[str, int]:
    return {f.path: f.file_size for f in client.list_artifacts(run_id, folder)}


def in_process(directory: Path, uri: str, monkeypatch: pytest.MonkeyPatch, capsys, run) -> tuple[object, str]:
    """``run()`` (a recipes entry point) in ``directory`` tracking into ``uri``: its result and stdout."""
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.chdir(directory)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        result = run()
    return result, capsys.readouterr().out


@pytest.mark.slow
def test_a_teams_day_on_an_mlflow_server_backed_by_postgresql(postgres: PostgresServer, tmp_path,
                                                              monkeypatch, capsys):
    from mlflow.tracking import MlflowClient
    import mlflow.artifacts

    server_root, a, b, c = (tmp_path / name for name in ("server", "a", "b", "c"))
    for folder in (server_root, a, b, c):
        folder.mkdir()
    server = MlflowServer(server_root, postgres.create_database("mlflow_team_day"))
    server.start()
    try:
        env = {**recipes_env(), "MLFLOW_TRACKING_URI": server.uri, "PYTHONUNBUFFERED": "1"}
        client = MlflowClient(server.uri)

        # 1. A: stopped by SIGTERM in its third epoch
        stopped = recipes(a, env, "fit", *SMALL, "--trainer.max_epochs", "3", "--mlflow_model", "false",
                          "--trainer.callbacks+=tests.team_runs.StopInThirdEpoch")
        assert stopped.returncode == 143, stopped.stdout[-2000:] + stopped.stderr[-2000:]
        (journal,) = (a / "checkpoints" / EXPERIMENT).glob(f"*/{JOURNAL_NAME}")
        run_id = journal.parent.name
        assert client.get_run(run_id).info.status == "KILLED"

        # 2. B: continues the run from the store (A's folder is on another machine, not here); the server is killed
        # and restarted in the middle of B's fit
        (a / "checkpoints").rename(a / "checkpoints-elsewhere")
        marker = tmp_path / "server-back.marker"
        b_env = {**env, SERVER_BACK_MARKER_ENV: str(marker), AFTER_BACK_ENV: "6", EPOCH_PAUSE_ENV: "0.1"}
        fit = preloaded_popen(
            [sys.executable, "-m", "recipes", "fit", *SMALL, "--trainer.max_epochs", "1000",
             "--ckpt_path", f"mlflow:{run_id}/last",
             "--trainer.callbacks+=tests.team_runs.StopSoonAfterTheServerIsBack"],
            cwd=b, env=b_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        out, err = TimedLines(fit.stdout), TimedLines(fit.stderr)
        try:
            deadline = time.monotonic() + 180
            while sum(bool(EPOCH_LINE.match(line)) for _, line in out.lines) < 2:
                assert fit.poll() is None and time.monotonic() < deadline, err.text()[-3000:]
                time.sleep(0.1)
            server.stop()
            gone = time.monotonic()
            away_until_the_fit_notices(fit, err, OUTAGE_S)
            server.start()  # the same port, PostgreSQL store and artifact destination
            back = time.monotonic()
            marker.write_text("back")
            fit.wait(timeout=300)
        finally:
            fit.kill()
            (a / "checkpoints-elsewhere").rename(a / "checkpoints")
        out.thread.join(10)
        err.thread.join(10)
        assert fit.returncode == 0, err.text()[-3000:]

        history = {m.step: m.value for m in client.get_metric_history(run_id, "val/acc")}
        best_step = min(history, key=history.get)
        assert best_step == 2 and all(v > history[2] for s, v in history.items() if s != 2), history  # the scenario
        value = f"{history[2]:.4g}"
        resumed = re.search(r"^recipes: resuming run .*$", out.text(), re.M)
        assert resumed is not None, out.text()[-2000:]
        assert re.fullmatch(
            rf"recipes: resuming run {run_id} from epoch \d+, step \d+ \(mlflow:{run_id}/last\); best so far: epoch 1, "
            rf"val/acc {re.escape(value)} \(checkpoints/{EXPERIMENT}/{run_id}/best\.ckpt, fetched from the store\)",
            resumed.group(0)), resumed.group(0)

        # the loop never waited on the server; one clean warning; caught up by itself, during the fit
        epochs = [(at, int(m.group(2))) for at, line in out.lines if (m := EPOCH_LINE.match(line))]
        gaps = [y[0] - x[0] for x, y in zip(epochs, epochs[1:])]
        usual = statistics.median(gaps)
        assert len([at for at, _ in epochs if gone <= at <= back]) >= 5, (epochs, gone, back)
        assert max(gaps) < usual + 5, f"usual epoch {usual:.2f} s, longest gap {max(gaps):.2f} s"
        # (the other warnings: the TrainingPlan's, resumed to other max_epochs; MLflow's hints as it logs the model)
        warnings = [line for _, line in err.lines if re.search("tracking (store|server)|answer|connection", line, re.I)
                    and "answers again (away" not in line]
        assert len(warnings) == 1 and warnings[0].startswith(
            "recipes: warning: the tracking store stopped accepting writes: the tracking server at "
            f"{server.uri} does not answer ("), err.text()[-3000:]
        assert not [line for _, line in err.lines if re.search("Traceback|urllib3|HTTPConnectionPool|Retry", line)]
        caught_up = [at for at, line in err.lines if "answers again (away" in line]  # a notice, on stderr
        assert len(caught_up) == 1 and back <= caught_up[0] < epochs[-1][0], err.text()[-3000:]
        assert "answers again (away" not in out.text()

        # the record is complete without `recipes sync`: FINISHED, every validation of A and B once
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        b_steps = [step - 1 for _, step in epochs]  # the line shows the step after the epoch; val is logged at its last
        assert sorted(history) == sorted({2, 5} | set(b_steps))  # A validated epochs 1 and 2
        assert len(client.get_metric_history(run_id, "val/acc")) == len(history)  # no value written twice

        # best.ckpt here, in the store and in the logged model: epoch 1 (global step 3), the run's best
        expected = (1, 3, pytest.approx(history[2], abs=1e-6))
        downloads = tmp_path / "downloads"
        assert best_of(b / "checkpoints" / EXPERIMENT / run_id / "best.ckpt") == expected
        assert best_of(Path(client.download_artifacts(run_id, "checkpoints/best.ckpt", str(downloads)))) == expected
        model = client.get_logged_model(run.data.tags["loopwise.model_uri"].removeprefix("models:/"))
        assert model.source_run_id == run_id
        model_dir = mlflow.artifacts.download_artifacts(artifact_uri=model.artifact_location,
                                                        dst_path=str(downloads / "model"), tracking_uri=server.uri)
        model_ckpts = sorted(Path(model_dir).rglob("*.ckpt"))
        assert model_ckpts and all(best_of(p) == expected for p in model_ckpts)
        stored_last = client.download_artifacts(run_id, "checkpoints/last.ckpt", str(downloads))
        assert torch.load(stored_last, weights_only=True, map_location="cpu")["global_step"] == epochs[-1][1]

        # 3. C: `--ckpt_path best` finds the team's run in the store
        fetched = c / "checkpoints" / ".fetched" / run_id / "best.ckpt"
        _, c_out = in_process(c, server.uri, monkeypatch, capsys, lambda: main(
            ["test", *SMALL, "--trainer.limit_test_batches", "2", "--ckpt_path", "best"]))
        assert (f"recipes: --ckpt_path best = {fetched.resolve()} (run {run_id}, epoch 1, val/acc {value} (best of 1 "
                f"finished fit run(s)), by {getpass.getuser()}@{socket.gethostname()}, fetched from the store)"
                ) in c_out.splitlines(), c_out[-2000:]
        experiment = client.get_experiment_by_name(EXPERIMENT)
        (tested,) = client.search_runs([experiment.experiment_id], "tags.`loopwise.stage` = 'test'")
        assert tested.info.status == "FINISHED" and "test/acc" in tested.data.metrics

        # 4. A: `recipes sync` twice with its stale journal: the run's record and artifacts stay as they are
        before, uploads = record_of(client, run_id), artifacts_of(client, run_id, "checkpoints")
        for _ in range(2):
            code, sync_out = in_process(a, server.uri, monkeypatch, capsys, lambda: sync_main(
                ["--checkpoints_dir", str(a / "checkpoints"), "--tracking_uri", server.uri]))
            assert code == 0
            assert record_of(client, run_id) == before  # status, end time, every tag, param and metric history
            assert artifacts_of(client, run_id, "checkpoints") == uploads  # A's older last.ckpt not sent
            (line,) = [x for x in sync_out.splitlines() if x.startswith("recipes sync:")]
            assert f"run {run_id}: nothing written (0 metric value(s), 0 param(s), 0 tag(s))" in line, line
            assert "status kept FINISHED (the store's, set " in line and "than the journal's KILLED at" in line, line
        print(f"server away {back - gone:.1f} s, usual epoch {usual:.2f} s, longest gap {max(gaps):.2f} s, caught up "
              f"{caught_up[0] - back:.1f} s after it was back; {len(epochs)} epochs in B")
    finally:
        server.stop()
