"""A run resumed in another directory keeps the best of its whole history (issue 30, point 2).

Three working directories share one tracking store (``MLFLOW_TRACKING_URI=sqlite:///<shared>/mlflow.db``), as a
team's machines share a server: A trains 3 epochs; C continues the run from a copy of A's ``last.ckpt`` to epoch 5
(A's folder still on this machine: the best file is copied from it); B continues it with ``mlflow:<id>/last`` to
epoch 7 with A's and C's folders gone (the best file is fetched from the store). The monitored metric is ``val/acc``
with mode ``min``, so the best is epoch 1 and every later epoch is worse (asserted from the store's history).
Before the fix, Lightning dropped the best on the changed folder ("The dirpath has changed") and the first epoch
after each resume replaced ``best.ckpt``, its uploaded copy and the logged model.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL, copy_migrated_store
from tests.team_runs import WORSE_LATER, best_of

EXPERIMENT = "spiral_mlp"
SMALL = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2", "--system_metrics_interval", "0"]


def fit(directory: Path, *extra: str) -> tuple[str, list[str]]:
    """``recipes fit`` of the spiral recipe in ``directory`` (in this process): its stdout and warning messages."""
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(directory)
    try:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out):
            warnings.simplefilter("always")
            main(["fit", "-c", str(SPIRAL), *SMALL, *WORSE_LATER, *extra])
    finally:
        os.chdir(cwd)
    return out.getvalue(), [str(w.message) for w in caught]


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory, migrated_store: Path) -> dict:
    root = tmp_path_factory.mktemp("team").resolve()
    shared, a, b, c = (root / name for name in ("shared", "a", "b", "c"))
    for directory in (shared, a, b, c):
        directory.mkdir()
    copy_migrated_store(migrated_store, shared)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{shared / 'mlflow.db'}")
        fit(a, "--trainer.max_epochs", "3", "--mlflow_model", "false")
        (run_id,) = [p.parent.name for p in (a / "checkpoints" / EXPERIMENT).glob("*/last.ckpt")]
        copied = c / "from-a" / "last.ckpt"
        copied.parent.mkdir()
        shutil.copyfile(a / "checkpoints" / EXPERIMENT / run_id / "last.ckpt", copied)
        c_out, c_warnings = fit(c, "--trainer.max_epochs", "5", "--mlflow_model", "false", "--ckpt_path", str(copied))
        for directory in (a, c):  # another machine's folders: not on this one
            (directory / "checkpoints").rename(directory / "checkpoints-elsewhere")
        b_out, b_warnings = fit(b, "--trainer.max_epochs", "7", "--ckpt_path", f"mlflow:{run_id}/last")
        (c / "checkpoints-elsewhere").rename(c / "checkpoints")
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{shared / 'mlflow.db'}")
        history = {m.step: m.value for m in client.get_metric_history(run_id, "val/acc")}
        run = client.get_run(run_id)
        downloads = root / "downloads"
        stored_best = Path(client.download_artifacts(run_id, "checkpoints/best.ckpt", str(downloads)))
        import mlflow.artifacts

        from recipes.run.process_settings import process_settings_kept

        # MLflow resolves a models:/ URI through its global tracking URI (not the tracking_uri argument); the fits no
        # longer leave theirs set, and another test of this process may have left its own
        with process_settings_kept():
            mlflow.set_tracking_uri(f"sqlite:///{shared / 'mlflow.db'}")
            model_dir = mlflow.artifacts.download_artifacts(
                artifact_uri=run.data.tags["loopwise.model_uri"], dst_path=str(downloads / "model"),
                tracking_uri=f"sqlite:///{shared / 'mlflow.db'}",
            )
    return {
        "run_id": run_id, "a": a, "b": b, "c": c, "history": history, "run": run, "stored_best": stored_best,
        "model_ckpts": sorted(Path(model_dir).rglob("*.ckpt")), "b_out": b_out, "c_out": c_out,
        "b_warnings": b_warnings, "c_warnings": c_warnings,
    }


def test_the_scenario_has_its_best_early_and_every_later_epoch_worse(team):
    history = team["history"]  # val/acc by step; mode min
    assert sorted(history) == [2, 5, 8, 11, 14, 17, 20]  # one run: 3 epochs in A, 2 in C, 2 in B
    best_step = min(history, key=history.get)
    assert best_step == 2  # epoch 1, in A
    assert all(value > history[2] for step, value in history.items() if step > 8)  # C's and B's epochs: worse
    assert team["run"].info.status == "FINISHED"


def test_resumed_from_the_store_elsewhere_best_ckpt_upload_and_model_are_the_best_epoch(team):
    # epoch 1 ends at global step 3 (its validation is logged at step 2, the last batch's step)
    expected = (1, 3, pytest.approx(team["history"][2], abs=1e-6))
    run_folder = team["b"] / "checkpoints" / EXPERIMENT / team["run_id"]
    assert best_of(run_folder / "best.ckpt") == expected
    assert best_of(team["stored_best"]) == expected  # the store's checkpoints/best.ckpt
    assert team["model_ckpts"] and all(best_of(p) == expected for p in team["model_ckpts"])  # the logged model
    assert not list(run_folder.glob(".best-from-store-*"))  # the download's scratch folder is gone


def test_resumed_from_a_copied_last_ckpt_best_ckpt_is_the_best_epoch(team):
    run_folder = team["c"] / "checkpoints" / EXPERIMENT / team["run_id"]
    assert best_of(run_folder / "best.ckpt") == (1, 3, pytest.approx(team["history"][2], abs=1e-6))


def test_the_resumed_command_says_where_it_continues_and_which_best_it_keeps(team):
    run_id, value = team["run_id"], f"{team['history'][2]:.4g}"
    b_line = re.search(r"^recipes: resuming run .*$", team["b_out"], re.M)
    assert b_line is not None, team["b_out"][-2000:]
    assert b_line.group(0) == (
        f"recipes: resuming run {run_id} from epoch 5, step 15 (mlflow:{run_id}/last); best so far: epoch 1, "
        f"val/acc {value} (checkpoints/{EXPERIMENT}/{run_id}/best.ckpt, fetched from the store)"
    )
    c_line = re.search(r"^recipes: resuming run .*$", team["c_out"], re.M)
    a_best = team["a"] / "checkpoints" / EXPERIMENT / run_id / "best.ckpt"
    assert c_line is not None and c_line.group(0) == (
        f"recipes: resuming run {run_id} from epoch 3, step 9 ({team['c'] / 'from-a' / 'last.ckpt'}); best so far: "
        f"epoch 1, val/acc {value} (checkpoints/{EXPERIMENT}/{run_id}/best.ckpt, copied from {a_best})"
    )


def test_lightnings_dirpath_warning_is_not_shown(team):
    for caught in (team["b_warnings"], team["c_warnings"]):
        assert not [m for m in caught if "dirpath has changed" in m]
