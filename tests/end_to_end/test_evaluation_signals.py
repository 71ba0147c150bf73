"""SIGTERM or Ctrl+C during validate, test or predict (issue 16, item 5): the run ends KILLED, the exit code is 143
or 130 and the one line says what was not saved. Before: FAILED, "last.ckpt saved" (it was not), exit 1 for Ctrl+C,
and a SIGTERM during predict was ignored until the predictions were written."""

from __future__ import annotations

import os
import signal

import pytest
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from tests.conftest import SPIRAL, runs_of


class SignalAt(Callback):
    """Send ``signum`` to this process at the second batch of an evaluation."""

    def __init__(self, signum: int = 15) -> None:
        self.signum = signum

    def _maybe(self, trainer, batch_idx: int) -> None:
        if batch_idx == 1 and not trainer.training:
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._maybe(trainer, batch_idx)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._maybe(trainer, batch_idx)

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self._maybe(trainer, batch_idx)


@pytest.fixture(scope="module")
def fitted(clean_workdir):
    with clean_workdir("fitted") as directory:
        main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--mlflow_model", "false"])
    return directory


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_an_evaluation_ends_its_run_killed(fitted, monkeypatch, capsys, stage, signum):
    monkeypatch.chdir(fitted)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    previous = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as exc:
        main([stage, "-c", str(SPIRAL), "--ckpt_path", "last", "--predictions_path", f"{stage}-{signum}.csv",
              "--trainer.callbacks+=tests.end_to_end.test_evaluation_signals.SignalAt",
              "--trainer.callbacks.signum", str(int(signum))])  # fmt: skip
    assert signal.getsignal(signal.SIGINT) == previous  # the handlers are given back
    name = signal.Signals(signum).name
    assert exc.value.code == 128 + int(signum)
    unsaved = "no predictions were written" if stage == "predict" else "its metrics were not logged"
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"recipes: {stage} stopped by {name} (run marked KILLED; {unsaved})"
    )
    run = runs_of(fitted, "spiral_mlp")[-1]
    assert run.data.tags["loopwise.stage"] == stage and run.info.status == "KILLED"
    assert not (fitted / f"{stage}-{signum}.csv").exists()
