"""A second process on a run being trained (its first fit or a resume) fails at once, naming the process that holds
it (issue 16, item 5; issue 28, part 7: the first fit took no lock)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from recipes.cli import main
from recipes.checkpoints.run_lock import hold_run_lock, lock_path, release_run_locks
from tests.conftest import SPIRAL, recipes_env, runs_of
from tests.preloaded_python import preloaded_popen


@pytest.mark.slow
def test_a_second_resume_of_a_run_being_resumed_fails_at_once(workdir, capsys):
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--mlflow_model", "false"])
    run_id = runs_of(workdir, "spiral_mlp")[0].info.run_id
    lock = lock_path(workdir / "checkpoints" / "spiral_mlp", run_id)
    env = recipes_env()
    first = preloaded_popen(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), "--ckpt_path", "last",
         "--trainer.max_epochs", "400", "--mlflow_model", "false"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (lock.exists() and f"process {first.pid}" in lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, "the first resume did not take the lock"
            time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(SystemExit) as exc:
            main(["fit", "-c", str(SPIRAL), "--ckpt_path", "last", "--trainer.max_epochs", "400"])
        assert exc.value.code == 2 and time.monotonic() - started < 30
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith(f"recipes: error: run {run_id} is being trained by process {first.pid} on ")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    hold_run_lock(workdir / "checkpoints" / "spiral_mlp", run_id)  # released when its process ended
    release_run_locks()


def test_a_resume_of_a_run_whose_first_fit_is_still_training_fails_at_once(workdir, capsys):
    """The first fit holds its run's lock too: `fit --ckpt_path last` during it used to train the same run twice."""
    env = {**recipes_env(), "OMP_NUM_THREADS": "1"}
    first = preloaded_popen(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), "--trainer.max_epochs", "400",
         "--mlflow_model", "false", "--torch_threads", "1"],
        cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list((workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt")):
            assert first.poll() is None and time.monotonic() < deadline, "the first fit wrote no last.ckpt"
            time.sleep(0.2)
        [last] = (workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt")
        run_id = last.parent.name
        lock = lock_path(workdir / "checkpoints" / "spiral_mlp", run_id)
        assert lock.read_text().startswith(f"process {first.pid} on ")
        started = time.monotonic()
        with pytest.raises(SystemExit) as exc:
            main(["fit", "-c", str(SPIRAL), "--ckpt_path", "last", "--trainer.max_epochs", "1"])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2 and time.monotonic() - started < 60, err
        assert err[-1].startswith(f"recipes: error: run {run_id} is being trained by process {first.pid} on ")
        assert [line for line in err if line.startswith("recipes: error")] == [err[-1]]
        assert first.poll() is None  # the first fit trains on, alone
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=120)
    assert first.returncode == 143, first.stderr.read()[-2000:]
    hold_run_lock(workdir / "checkpoints" / "spiral_mlp", run_id)  # released when its process ended
    release_run_locks()
    [run] = runs_of(workdir, "spiral_mlp")
    assert run.info.status == "KILLED"
