"""The run's record stays true across resumes from older checkpoints and store faults (issue 28, parts 3 and 4):
a resume from an older checkpoint is a new run linked to the old one, a resume of another experiment's run stays in
that experiment, a run recreated by `recipes sync` keeps its files reachable, and a replay never marks a hard-killed
attempt FINISHED."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from recipes.compare.report import notes
from recipes.compare.rows import build_table
from recipes.tracking.journal import JOURNAL_NAME, TrackingJournal, read_journal, replay
from tests.conftest import SPIRAL, mlflow_client, recipes_env, runs_of
from tests.resume_runs import TINY, fit, new_runs, run_dir, steps
from tests.preloaded_python import preloaded_run

# --- part 3: a resume from an older checkpoint is a branch --------------------------------------------------------


def test_a_resume_from_an_older_checkpoint_is_a_new_run_linked_to_the_old_one(store):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "2")
    (first,) = new_runs(store, before)
    old_id = first.info.run_id
    ep2 = store / f"ep2-{old_id}.ckpt"
    shutil.copy(run_dir(store, old_id) / "last.ckpt", ep2)  # after epoch 2: step 6
    fit("--trainer.max_epochs", "3", "--ckpt_path", "last")  # the same run goes on to epoch 3 (step 9)
    old_history = [(m.step, m.value) for m in mlflow_client(store).get_metric_history(old_id, "val/acc")]
    assert [s for s, _ in old_history] == [2, 5, 8]

    fit("--trainer.max_epochs", "5", "--ckpt_path", str(ep2))  # back to step 6, a longer schedule
    runs = new_runs(store, before)
    assert len(runs) == 2, "the older checkpoint went on in the old run"
    old, branch = runs
    assert old.info.run_id == old_id
    # the old run keeps its own trajectory, nothing of the branch mixed in
    assert [(m.step, m.value) for m in mlflow_client(store).get_metric_history(old_id, "val/acc")] == old_history
    tags = branch.data.tags
    assert tags["loopwise.resumed_from_run"] == old_id and tags["loopwise.resumed_from_step"] == "6"
    assert branch.info.status == "FINISHED" and branch.data.tags["loopwise.checkpoint_step"] == "15"
    # the branch's history: the old run's before step 6, then its own retrained epochs 3-5
    history = {m.step: m.value for m in mlflow_client(store).get_metric_history(branch.info.run_id, "val/acc")}
    assert sorted(history) == [2, 5, 8, 11, 14]
    assert [history[2], history[5]] == [v for _, v in old_history[:2]]
    client = mlflow_client(store)
    for key in set(branch.data.metrics) - {"epoch"}:  # copied history, resumed epoch's train metrics: each step once
        logged = [m.step for m in client.get_metric_history(branch.info.run_id, key)]
        assert len(logged) == len(set(logged)), f"{key} logged twice at a step: {sorted(logged)}"
    assert torch.load(run_dir(store, branch.info.run_id) / "last.ckpt", weights_only=True)["loopwise"] == {
        "mlflow_run_id": branch.info.run_id, "experiment": "spiral_mlp", "step": "15"}  # fmt: skip
    # recipes compare shows it
    table = build_table(mlflow_client(store), [old, branch], "val/acc", "spiral_mlp")
    assert [row["resumed from"] for row in table.rows] == ["", f"{old_id} @ step 6"]
    assert any(f"resumed from step 6 of run {old_id[:8]}" in line for line in notes(table, [], 400))


def test_resuming_the_newest_checkpoint_still_continues_the_run(store):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (first,) = new_runs(store, before)
    fit("--trainer.max_epochs", "2", "--ckpt_path", str(run_dir(store, first.info.run_id) / "last.ckpt"))
    (run,) = new_runs(store, before)
    assert run.info.run_id == first.info.run_id and "loopwise.resumed_from_run" not in run.data.tags
    assert steps(store, run.info.run_id, "val/acc") == [2, 5]
    starts = [e for e in read_journal(run_dir(store, run.info.run_id) / JOURNAL_NAME) if e["kind"] == "start"]
    assert len(starts) == 2 and all(e["pid"] == os.getpid() for e in starts)  # one per attempt


def test_a_resume_of_another_experiments_run_stays_in_its_experiment_and_folder(store):
    other = ["--trainer.logger.init_args.experiment_name", "spiral_other"]
    before = runs_of(store, "spiral_other")
    fit("--trainer.max_epochs", "1", *other)
    (first,) = [r for r in runs_of(store, "spiral_other") if r.info.run_id not in {b.info.run_id for b in before}]
    run_id = first.info.run_id
    fit("--trainer.max_epochs", "2", "--ckpt_path", f"mlflow:{run_id}/last")  # the config's experiment: spiral_mlp
    assert not (store / "checkpoints" / "spiral_mlp" / run_id).exists()
    folder = store / "checkpoints" / "spiral_other" / run_id
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6
    assert mlflow_client(store).get_run(run_id).info.experiment_id == first.info.experiment_id
    assert steps(store, run_id, "val/acc") == [2, 5]


# --- part 4: a replay decides by the last attempt ----------------------------------------------------------------


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def journal_of_two_attempts(tmp_path: Path, second_pid: int) -> list[dict]:
    """A first attempt that ended FINISHED, then a resume (process ``second_pid``) that never wrote a status."""
    import socket

    path = tmp_path / JOURNAL_NAME
    lines = [
        {"kind": "start", "time": 1000, "host": socket.gethostname(), "pid": dead_pid()},
        {"kind": "metrics", "step": 0, "time": 1001, "values": {"loss": 1.0}},
        {"kind": "status", "status": "FINISHED", "time": 2000},
        {"kind": "start", "time": 3000, "host": socket.gethostname(), "pid": second_pid},
        {"kind": "metrics", "step": 1, "time": 3001, "values": {"loss": 0.5}},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return read_journal(path)


def test_a_replay_ends_a_hard_killed_resume_killed_not_finished(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id  # RUNNING, as a kill -9 leaves it
    summary = replay(journal_of_two_attempts(tmp_path, dead_pid()), client, run_id)
    run = client.get_run(run_id)
    assert (summary.status, run.info.status) == ("KILLED", "KILLED")
    assert "ended without closing the run" in run.data.tags["loopwise.abandoned"]
    again = replay(read_journal(tmp_path / JOURNAL_NAME), client, run_id)
    assert (again.metric_values, again.tags, again.status) == (0, 0, None)


def test_a_replay_leaves_a_run_whose_last_attempt_still_runs_alone(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    summary = replay(journal_of_two_attempts(tmp_path, os.getpid()), client, run_id)  # this process: alive
    assert summary.status is None and client.get_run(run_id).info.status == "RUNNING"


def test_the_journal_opens_each_attempt_with_a_start_entry(tmp_path):
    for _ in range(2):
        journal = TrackingJournal(tmp_path / JOURNAL_NAME)
        journal.record("params", values={"lr": "0.1"})
        journal.close()
    kinds = [e["kind"] for e in read_journal(tmp_path / JOURNAL_NAME)]
    assert kinds == ["start", "params", "start", "params"]


class KillSelfInSecondEpoch(Callback):
    """kill -9 of this process once the second epoch's first batch ran (after a resume of a 1-epoch run)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 1:
            os.kill(os.getpid(), signal.SIGKILL)


def recipes(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = recipes_env()
    return preloaded_run([sys.executable, "-m", "recipes", *args], cwd=workdir, env=env, timeout=300)


@pytest.mark.slow
def test_a_finished_run_resumed_then_killed_9_is_not_finished_after_recipes_sync(workdir):
    tiny = [*TINY, "--mlflow_model", "false"]
    assert recipes(workdir, "fit", "-c", str(SPIRAL), *tiny, "--trainer.max_epochs", "1").returncode == 0
    killed = recipes(workdir, "fit", "-c", str(SPIRAL), *tiny, "--trainer.max_epochs", "3", "--ckpt_path", "last",
                     "--trainer.callbacks+=tests.tracking.test_record_branches.KillSelfInSecondEpoch")  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    synced = recipes(workdir, "sync")
    assert synced.returncode == 0 and "status KILLED" in synced.stdout, synced.stdout + synced.stderr[-2000:]
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.info.status == "KILLED" and "loopwise.abandoned" in run.data.tags
    best = recipes(workdir, "fit", "-c", str(SPIRAL), *tiny, "--ckpt_path", "best")
    assert best.returncode == 2 and "no best.ckpt" in best.stdout + best.stderr  # a KILLED run is not `best`


# --- part 4: a run recreated by `recipes sync` keeps its files -----------------------------------------------------


class DeleteStoreAfterFirstEpoch(Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            Path("mlflow.db").unlink()


@pytest.mark.slow
def test_a_run_recreated_by_sync_keeps_its_artifacts_checkpoints_and_resume(workdir):
    first = recipes(workdir, "fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2",
                    "--trainer.callbacks+=tests.tracking.test_record_branches.DeleteStoreAfterFirstEpoch")  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    (journal,) = (workdir / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}")
    folder, old_id = journal.parent, journal.parent.name
    synced = recipes(workdir, "sync")
    assert synced.returncode == 0 and f"recreated from {old_id}" in synced.stdout, synced.stderr[-2000:]
    (run,) = runs_of(workdir, "spiral_mlp")
    new_id = run.info.run_id
    client = mlflow_client(workdir)
    artifacts = {a.path for a in client.list_artifacts(new_id)} | {
        a.path for a in client.list_artifacts(new_id, "checkpoints")}  # fmt: skip
    assert {"config.yaml", "checkpoints/best.ckpt", "checkpoints/last.ckpt"} <= artifacts
    # the model is an MLflow 3 logged model, a record of the store (issue 30): a store gone when the fit ended holds
    # none then; the fit kept it beside the journal and sync logs it into the recreated run (issue 53 reversed the
    # earlier "sync does not log one")
    assert run.data.tags["loopwise.model_uri"].startswith("models:/")
    assert (workdir / "checkpoints" / "spiral_mlp" / new_id).resolve() == folder.resolve()
    again = recipes(workdir, "sync")
    assert "0 metric value(s), 0 param(s), 0 tag(s)" in again.stdout and again.stdout.count("recipes sync:") == 1
    # `last` finds the run's files, and a resume continues the recreated run in its folder
    resumed = recipes(workdir, "fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "3", "--ckpt_path", "last",
                      "--mlflow_model", "false")  # fmt: skip
    assert resumed.returncode == 0 and f"run {new_id}" in resumed.stdout, resumed.stdout + resumed.stderr[-2000:]
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.info.run_id == new_id and run.info.status == "FINISHED"
    assert steps(workdir, new_id, "val/acc") == [2, 5, 8]
    assert torch.load(folder / "last.ckpt", weights_only=True)["loopwise"]["mlflow_run_id"] == new_id
    # a checkpoint stamped with the old id resumes the recreated run too
    best = recipes(workdir, "fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "3", "--mlflow_model", "false",
                   "--ckpt_path", f"mlflow:{old_id}/best")
    assert best.returncode == 0, best.stdout + best.stderr[-2000:]


def test_an_older_checkpoint_is_told_by_the_journal_when_the_store_missed_the_last_tags(tmp_path):
    """A store that failed mid-run holds an older loopwise.checkpoint_step than the run's journal."""
    from jsonargparse import Namespace

    from recipes.checkpoints.run_stamp import continue_stamped_run
    from recipes.run.recipes_cli import RecipesCLI

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("spiral_mlp")).info.run_id
    client.set_tag(run_id, "loopwise.checkpoint_step", "6")  # the store's last write before it failed
    journal = TrackingJournal(tmp_path / "checkpoints" / "spiral_mlp" / run_id / JOURNAL_NAME)
    for step in (6, 9):
        journal.record("tags", values={"loopwise.checkpoint_step": str(step)})
    journal.close()
    stamp = {"mlflow_run_id": run_id, "experiment": "spiral_mlp", "step": "6"}
    continued = Namespace(init_args=Namespace(run_id=None, tags=None))
    # no checkpoints folder: the store's tag only
    RecipesCLI.apply_to_config(continued, continue_stamped_run(continued, stamp, "ep2.ckpt", uri))
    assert continued.init_args.run_id == run_id
    branched = Namespace(init_args=Namespace(run_id=None, tags=None))
    changes = continue_stamped_run(branched, stamp, "ep2.ckpt", uri, tmp_path / "checkpoints")
    RecipesCLI.apply_to_config(branched, changes)
    assert branched.init_args.run_id is None
    assert branched.init_args.tags == {"loopwise.resumed_from_run": run_id, "loopwise.resumed_from_step": "6"}
