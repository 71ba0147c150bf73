"""A run's record as the team reads it (issue 53, part 4): a run a later command closed KILLED because its process
was gone (``loopwise.abandoned``), then resumed with ``--ckpt_path last`` and finished, no longer says it was
abandoned, and its end time (MLflow's Duration: end_time - start_time) is that of the resume's end; a run's
``loopwise.checkpoint_step`` is its newest checkpoint's step when it ends."""

from __future__ import annotations

import socket
import subprocess
import time

from lightning.pytorch.callbacks import Callback

from tests.conftest import mlflow_client, runs_of
from tests.resume_runs import fit


def test_a_resumed_run_that_finishes_drops_its_abandoned_tag_and_ends_when_the_resume_ends(workdir):
    fit("--trainer.max_epochs", "1")
    [run] = runs_of(workdir, "spiral_mlp")
    run_id = run.info.run_id
    # the fit's process as if killed -9 mid-run: RUNNING, naming a process that no longer exists
    dead = subprocess.Popen(["true"])
    dead.wait()
    client = mlflow_client(workdir)
    client.update_run(run_id, status="RUNNING")
    client.set_tag(run_id, "loopwise.pid", str(dead.pid))
    client.set_tag(run_id, "loopwise.host", socket.gethostname())
    time.sleep(0.05)
    before_resume = int(time.time() * 1000)
    fit("--trainer.max_epochs", "2", "--ckpt_path", "last")  # closes it KILLED (abandoned), then resumes it
    [resumed] = runs_of(workdir, "spiral_mlp")
    assert resumed.info.run_id == run_id and resumed.info.status == "FINISHED"
    assert "loopwise.abandoned" not in resumed.data.tags, resumed.data.tags["loopwise.abandoned"]
    assert resumed.info.end_time >= before_resume  # the Duration covers the resume, not the first attempt alone


class PauseAfterEachEpoch(Callback):
    """Two seconds after each training epoch: a run long enough for its held values to go to MLflow's queue."""

    def on_train_epoch_end(self, trainer, pl_module):
        time.sleep(2.0)


def test_the_checkpoint_step_tag_is_the_newest_checkpoints_step_when_the_run_ends(workdir):
    """``loopwise.checkpoint_step`` said 44 while the run's newest checkpoint was at step 66: the tag of the last
    save, written synchronously at the end, was overwritten by an older value still in MLflow's asynchronous queue."""
    import torch

    from recipes.tracking.journal import JOURNAL_NAME, read_journal

    from recipes.cli import main
    from tests.conftest import SPIRAL

    pause = "tests.tracking.test_resumed_run_record.PauseAfterEachEpoch"  # values held 5 s go to MLflow's queue
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3", f"--trainer.callbacks+={pause}"])
    [run] = runs_of(workdir, "spiral_mlp")
    folder = workdir / "checkpoints" / "spiral_mlp" / run.info.run_id
    newest = torch.load(folder / "last.ckpt", weights_only=False, map_location="cpu")["global_step"]
    journaled = [e["values"]["loopwise.checkpoint_step"] for e in read_journal(folder / JOURNAL_NAME)
                 if e["kind"] == "tags" and "loopwise.checkpoint_step" in e["values"]]
    assert journaled[-1] == str(newest)
    assert run.data.tags["loopwise.checkpoint_step"] == str(newest)
    assert run.data.tags["loopwise.last.step"] == str(newest)
