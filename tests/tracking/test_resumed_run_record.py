"""The record of a run that was resumed (issue 53, part 4): a run a later command closed KILLED because its process
was gone (``loopwise.abandoned``), then resumed with ``--ckpt_path last`` and finished, no longer says it was
abandoned, and its end time (MLflow's Duration: end_time - start_time) is that of the resume's end."""

from __future__ import annotations

import socket
import subprocess
import time

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
