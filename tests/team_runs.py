"""Helpers of the tests where several working directories share one tracking store, as a team's machines share a
server (tests/checkpoints/test_resume_elsewhere.py, tests/tracking/test_sync_merge.py,
tests/end_to_end/test_team_on_postgres.py): what a ``best.ckpt`` says about itself, a run's whole record in the
store, and the callbacks that a recipe run in a subprocess takes by class path (``--trainer.callbacks+=...``)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

# the monitored metric of the resume-elsewhere scenarios: val/acc with mode min. Accuracy rises, so epoch 1 is the
# run's "best" and every later epoch is worse: a resume that loses its best replaces best.ckpt with a later epoch
WORSE_LATER = ["--model.monitor", "val/acc", "--model.monitor_mode", "min"]
SERVER_BACK_MARKER_ENV = "LOOPWISE_TEST_SERVER_BACK_MARKER"
AFTER_BACK_ENV = "LOOPWISE_TEST_EPOCHS_AFTER_BACK_S"
EPOCH_PAUSE_ENV = "LOOPWISE_TEST_EPOCH_PAUSE_S"


def best_of(path: Path) -> tuple[int, int, float]:
    """(epoch counted from 1, global step, monitored value) that a ``best.ckpt`` says about itself."""
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    (state,) = [s for k, s in ckpt["callbacks"].items() if "'alias': 'best'" in k]
    return ckpt["epoch"] + 1, ckpt["global_step"], float(state["best_model_score"])


def record_of(client, run_id: str) -> dict:
    """The whole record of a run in the store (an ``MlflowClient``): status, end time, tags, params, every metric
    history."""
    run = client.get_run(run_id)
    return {
        "status": run.info.status,
        "end_time": run.info.end_time,
        "tags": dict(run.data.tags),
        "params": dict(run.data.params),
        "metrics": {key: sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))
                    for key in run.data.metrics},
    }


class StopInThirdEpoch(Callback):
    """SIGTERM to this process in the third epoch (the recipe saves last.ckpt and ends the run KILLED, exit 143)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 2 and batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)


class StopSoonAfterTheServerIsBack(Callback):
    """Ends training normally (the run ends FINISHED) ``$LOOPWISE_TEST_EPOCHS_AFTER_BACK_S`` seconds after the test
    says the server is back (the marker file ``$LOOPWISE_TEST_SERVER_BACK_MARKER``), so that the fit outlasts the
    outage whatever the speed of the machine; ``$LOOPWISE_TEST_EPOCH_PAUSE_S``: a pause after each epoch (fewer
    epochs in the same wall time)."""

    def __init__(self) -> None:
        self.back_since: float | None = None

    def on_train_epoch_end(self, trainer, pl_module):
        time.sleep(float(os.environ.get(EPOCH_PAUSE_ENV, "0")))
        if self.back_since is None and Path(os.environ[SERVER_BACK_MARKER_ENV]).is_file():
            self.back_since = time.monotonic()
        if self.back_since is not None and time.monotonic() - self.back_since >= float(os.environ[AFTER_BACK_ENV]):
            trainer.should_stop = True


class TimedLines:
    """The lines of a process's stream, each with the monotonic time it was read (a reader thread)."""

    def __init__(self, stream) -> None:
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def away_until_the_fit_notices(fit: subprocess.Popen, err: TimedLines, least_s: float,
                               timeout_s: float = 120.0) -> None:
    """Keep a stopped server away at least ``least_s`` seconds and until the fit ``fit`` (a process whose stderr
    ``err`` reads) has met the outage: its warning that the server does not answer. The fit writes the store behind
    its journal, through MLflow's queue, which sends every few seconds: a short outage can fall between two sends
    and the fit never meets it (a 3 s outage on a fast CI machine did, and the test found no warning)."""
    started = time.monotonic()  # only lines read from now on: the server was stopped right before
    while not (any("does not answer" in line for at, line in err.lines if at >= started)
               and time.monotonic() - started >= least_s):
        assert fit.poll() is None, f"the fit ended during the outage: {err.text()[-3000:]}"
        assert time.monotonic() - started < timeout_s, (f"no write met the outage in {timeout_s:.0f} s: "
                                                        f"{err.text()[-3000:]}")
        time.sleep(0.1)
