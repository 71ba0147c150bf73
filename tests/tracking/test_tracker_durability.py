"""The tracker is never behind the checkpoint (issue 16, item 1): a hard kill after a checkpoint loses none of the
metrics logged before it (they are in the fsynced journal, which the resume replays: issue 32), and the resume logs
no step twice."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from recipes.cli import main
from recipes.tracking.journal import JOURNAL_NAME, read_journal
from tests.conftest import REPO, SPIRAL, mlflow_client, recipes_env, runs_of
from tests.preloaded_python import preloaded_popen, preloaded_run

SIX_EPOCHS = ["--trainer.max_epochs", "6", "--mlflow_model", "false"]

DIE = textwrap.dedent(
    """
    import os

    import mlflow
    from lightning.pytorch.callbacks import Callback


    class DieAt(Callback):
        '''os._exit (no cleanup, like kill -9) at batch ``batch`` of epoch ``epoch`` (0-based), optionally after
        making MLflow's queued writes durable (so the killed attempt's last steps are in the store).'''

        def __init__(self, epoch: int = 2, batch: int = 0, flush_first: bool = False) -> None:
            self.epoch, self.batch, self.flush_first = epoch, batch, flush_first

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.current_epoch == self.epoch and batch_idx == self.batch:
                if self.flush_first:
                    mlflow.flush_async_logging()
                os._exit(9)
    """
)


def history(directory: Path, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in mlflow_client(directory).get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def uninterrupted(clean_workdir) -> dict[str, list[int]]:
    """The steps of val/acc and train/loss in a 6-epoch spiral run that nothing interrupts."""
    with clean_workdir("uninterrupted") as directory:
        main(["fit", "-c", str(SPIRAL), *SIX_EPOCHS])
    run = runs_of(directory, "spiral_mlp")[0]
    return {key: history(directory, run.info.run_id, key) for key in ("val/acc", "train/loss")}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("batch", "flush_first"),
    [(0, False), (12, True)],
    ids=["killed_at_an_epoch_start", "killed_mid_epoch_after_its_steps_were_written"],
)
def test_after_a_hard_kill_and_resume_every_step_is_logged_once(workdir, uninterrupted, batch, flush_first):
    (workdir / "die.py").write_text(DIE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), str(REPO)])}
    env.pop("MLFLOW_TRACKING_URI", None)
    killed = preloaded_run(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), *SIX_EPOCHS,
         "--trainer.callbacks+=die.DieAt", "--trainer.callbacks.batch", str(batch),
         "--trainer.callbacks.flush_first", str(flush_first).lower()],
        cwd=workdir, env=env, timeout=300,
    )  # fmt: skip
    assert killed.returncode == 9, killed.stderr[-2000:]
    run_id = runs_of(workdir, "spiral_mlp")[0].info.run_id
    # the checkpoint of epoch 2 is on disk, and so is everything logged before it: in the fsynced journal, the
    # write-ahead log (issue 32: the store is written behind it and may lack the last seconds until a replay)
    journal = read_journal(workdir / "checkpoints" / "spiral_mlp" / run_id / JOURNAL_NAME)
    journaled = sorted({e["step"] for e in journal if e.get("kind") == "metrics" and "val/acc" in e["values"]})
    assert journaled == uninterrupted["val/acc"][:2]
    stored = history(workdir, run_id, "val/acc")
    assert stored == uninterrupted["val/acc"][: len(stored)]
    main(["fit", "-c", str(SPIRAL), *SIX_EPOCHS, "--ckpt_path", "last"])
    runs = runs_of(workdir, "spiral_mlp")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    for key in ("val/acc", "train/loss"):
        assert history(workdir, run_id, key) == uninterrupted[key]  # every step, each once


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_is_marked_killed_by_the_next_command(workdir, capsys):
    (workdir / "die.py").write_text(DIE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(workdir), str(REPO)])}
    env.pop("MLFLOW_TRACKING_URI", None)
    killed = preloaded_run(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), *SIX_EPOCHS,
         "--trainer.callbacks+=die.DieAt", "--trainer.callbacks.epoch", "0", "--trainer.callbacks.batch", "3"],
        cwd=workdir, env=env, timeout=300,
    )  # fmt: skip
    assert killed.returncode == 9, killed.stderr[-2000:]
    (abandoned,) = runs_of(workdir, "spiral_mlp")
    assert abandoned.info.status == "RUNNING"  # nobody closed it: before, it stayed so for good
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--mlflow_model", "false"])
    assert f"run {abandoned.info.run_id} was left RUNNING by a process that no longer exists" in capsys.readouterr().err
    runs = {r.info.run_id: r for r in runs_of(workdir, "spiral_mlp")}
    assert runs[abandoned.info.run_id].info.status == "KILLED"
    assert "ended without closing the run" in runs[abandoned.info.run_id].data.tags["loopwise.abandoned"]
    new = next(r for r in runs.values() if r.info.run_id != abandoned.info.run_id)
    assert new.info.status == "FINISHED" and new.data.tags["loopwise.pid"] == str(os.getpid())


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.7, 1.5])
def test_kill_9_at_any_moment_after_a_checkpoint_then_resume_logs_every_step_once(workdir, uninterrupted, delay):
    import signal
    import time

    env = recipes_env()
    fit = preloaded_popen(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), *SIX_EPOCHS],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((workdir / "checkpoints").glob("spiral_mlp/*/last.ckpt")):
        assert fit.poll() is None and time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.05)
    time.sleep(delay)
    fit.send_signal(signal.SIGKILL)
    fit.wait(timeout=60)
    run_id = runs_of(workdir, "spiral_mlp")[0].info.run_id
    main(["fit", "-c", str(SPIRAL), *SIX_EPOCHS, "--ckpt_path", "last"])
    for key in ("val/acc", "train/loss"):
        assert history(workdir, run_id, key) == uninterrupted[key]  # every step, each once
