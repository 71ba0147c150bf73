"""A run that ends while its store is down (issue 53, section 2, and section 5's deleted store): the warning says what
happened to the store, and the replay of the run's journal writes what the end of the run would have written (the
logged model and its `loopwise.model_uri`, the confusion matrix, who ran it), whichever command replays it."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from tests.conftest import SPIRAL, recipes_env
from tests.preloaded_python import preloaded_run
from tests.resume_runs import TINY


class DeleteStoreAfterFirstEpoch(Callback):
    """Deletes ./mlflow.db when the first training epoch ends (the store vanishes under a running fit)."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            Path("mlflow.db").unlink()


READ_RECORD = """
import json, mlflow
from mlflow.tracking.context.registry import resolve_tags
client = mlflow.MlflowClient("sqlite:///mlflow.db")
(run,) = client.search_runs([client.get_experiment_by_name("spiral_mlp").experiment_id])
uri = run.data.tags.get("loopwise.model_uri", "")
model = client.get_logged_model(uri.removeprefix("models:/")) if uri.startswith("models:/") else None
print(json.dumps({
    "run_id": run.info.run_id,
    "tags": run.data.tags,
    "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
    "model": None if model is None else {"status": str(model.status), "source_run_id": model.source_run_id},
    "user": resolve_tags()["mlflow.user"],
}))
"""


def in_new_process(workdir: Path, *args: str):
    """``python <args>`` in a process of its own (this one still holds a connection to the deleted store)."""
    return preloaded_run([sys.executable, *args], cwd=workdir, env=recipes_env(), timeout=300)


@pytest.mark.slow
def test_a_run_whose_store_was_deleted_gets_its_model_figure_and_user_from_recipes_sync(workdir):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2",
              "--trainer.callbacks+=tests.tracking.test_outage_end.DeleteStoreAfterFirstEpoch"])  # fmt: skip
    (warning,) = [str(w.message) for w in caught if "stopped accepting writes" in str(w.message)]
    assert f"{workdir / 'mlflow.db'} was deleted (the file is missing)" in warning, warning
    assert "read-only" not in warning and "readonly" not in warning
    synced = in_new_process(workdir, "-m", "recipes", "sync")
    assert synced.returncode == 0, synced.stdout + synced.stderr[-3000:]
    record = json.loads(in_new_process(workdir, "-c", READ_RECORD).stdout)
    tags = record["tags"]
    assert tags["loopwise.replayed_from_run"] and record["run_id"] != tags["loopwise.replayed_from_run"]
    assert tags["mlflow.user"] == record["user"]  # who ran it, not nobody (`by @host` in recipes compare)
    assert tags["loopwise.model_uri"].startswith("models:/")
    assert record["model"] == {"status": "READY", "source_run_id": record["run_id"]}
    assert {"config.yaml", "confusion_matrix_val.png", "checkpoints"} <= set(record["artifacts"])
    again = in_new_process(workdir, "-m", "recipes", "sync")
    assert "0 replayed, 1 already complete" in again.stdout or "nothing written" in again.stdout, again.stdout
    assert json.loads(in_new_process(workdir, "-c", READ_RECORD).stdout)["tags"] == tags  # one model, logged once


class StoreMovedAsideAfterFirstEpoch(Callback):
    """Moves ./mlflow.db aside when the first training epoch ends (SQLite refuses every later write to a moved file);
    the test puts it back after the fit, as a person restoring a store from a backup would."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            Path("mlflow.db").rename("mlflow.db.aside")


@pytest.mark.slow
def test_the_next_command_that_reads_the_store_completes_the_end_of_a_run_it_missed(workdir):
    fit = in_new_process(workdir, "-m", "recipes", "fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2",
                         "--trainer.callbacks+=tests.tracking.test_outage_end.StoreMovedAsideAfterFirstEpoch")
    assert fit.returncode == 0 and "MLflow model not logged" in fit.stderr, fit.stderr[-3000:]
    (workdir / "mlflow.db.aside").replace(workdir / "mlflow.db")  # the store is back, the end of the run not in it
    before = json.loads(in_new_process(workdir, "-c", READ_RECORD).stdout)
    assert "loopwise.model_uri" not in before["tags"] and "confusion_matrix_val.png" not in before["artifacts"]
    compare = in_new_process(workdir, "-m", "recipes", "compare", "--experiment", "spiral_mlp")
    assert compare.returncode == 0, compare.stdout + compare.stderr[-3000:]
    after = json.loads(in_new_process(workdir, "-c", READ_RECORD).stdout)
    assert after["run_id"] == before["run_id"] and after["tags"]["loopwise.model_uri"].startswith("models:/")
    assert after["model"] == {"status": "READY", "source_run_id": after["run_id"]}
    assert "confusion_matrix_val.png" in after["artifacts"]
    assert f"{after['user']}@" in compare.stdout  # `by user@host` (mlflow.user), not `by @host`
