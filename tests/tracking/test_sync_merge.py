"""`recipes sync` (and a resume's replay) is a merge that never makes the record worse (issue 30, point 1): a journal
older than the store changes nothing (a run resumed and FINISHED in another directory stays FINISHED, a pruned trial
stays KILLED, held tags and params stay), what the store lacks or holds older is written, each sync says per run what it
wrote and kept, and a second sync writes nothing."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
from lightning.pytorch.callbacks import Callback
from mlflow.entities import Metric

from recipes.tracking.journal import JOURNAL_NAME, TrackingJournal, read_journal, replay
from recipes.tracking.sync import main as sync_main
from tests.conftest import SPIRAL, copy_migrated_store, free_port, recipes_env
from tests.resume_runs import TINY
from tests.team_runs import record_of
from tests.preloaded_python import preloaded_run


class Attempt:
    """One process writing a run as ``RecipeLogger`` does: each write to the store and, with a journal, to it."""

    def __init__(self, client: mlflow.MlflowClient, run_id: str, journal: Path | None = None) -> None:
        self.client, self.run_id = client, run_id
        self.journal = TrackingJournal(journal) if journal else None

    def write(self, kind: str, **data) -> None:
        if self.journal is not None:
            self.journal.record(kind, **data)
        time.sleep(0.003)  # distinct milliseconds for what comes next

    def tags(self, **values: str) -> None:
        self.write("tags", values=values)
        for key, value in values.items():
            self.client.set_tag(self.run_id, key, value)

    def params(self, **values: str) -> None:
        self.write("params", values=values)
        for key, value in values.items():
            self.client.log_param(self.run_id, key, value)

    def metrics(self, steps: range) -> None:
        for step in steps:
            now = int(time.time() * 1000)
            self.write("metrics", step=step, time=now, values={"train/loss": 1.0 / (step + 1)})
            self.client.log_batch(self.run_id, metrics=[Metric("train/loss", 1.0 / (step + 1), now, step)])

    def end(self, status: str) -> None:
        self.write("status", status=status, time=int(time.time() * 1000))
        self.client.set_terminated(self.run_id, status)  # MLflow's end time: now, after the journal's
        time.sleep(0.003)
        if self.journal is not None:
            self.journal.close()


@pytest.fixture
def client(tmp_path: Path, migrated_store: Path) -> mlflow.MlflowClient:
    """A client on a store of this test's own (a copy of the session's migrated store: no migration per test)."""
    return mlflow.MlflowClient(f"sqlite:///{copy_migrated_store(migrated_store, tmp_path)}")


def new_run(client: mlflow.MlflowClient) -> str:
    return client.create_run(client.create_experiment(f"e{time.time_ns()}")).info.run_id


def test_a_run_finished_elsewhere_keeps_its_status_tags_and_metrics_after_a_stale_replay(client, tmp_path):
    run_id, journal = new_run(client), tmp_path / "a" / JOURNAL_NAME
    here = Attempt(client, run_id, journal)  # directory A: stopped KILLED
    here.params(lr="0.1")
    here.tags(**{"loopwise.resumed": "false", "loopwise.checkpoint_step": "4"})
    here.metrics(range(5))
    here.end("KILLED")
    elsewhere = Attempt(client, run_id)  # directory B: resumed, FINISHED (its journal is in B)
    client.update_run(run_id, status="RUNNING")
    elsewhere.tags(**{"loopwise.resumed": "true", "loopwise.checkpoint_step": "9"})
    elsewhere.metrics(range(5, 10))
    elsewhere.end("FINISHED")
    before = record_of(client, run_id)
    for _ in range(2):  # any number of syncs
        summary = replay(read_journal(journal), client, run_id)
        assert record_of(client, run_id) == before  # status, end time, every tag and metric history unchanged
        assert (summary.metric_values, summary.params, summary.tags, summary.status) == (0, 0, 0, None)
        assert (summary.metric_values_held, summary.tags_kept) == (5, 2)
        line = summary.describe()
        assert line.startswith(f"run {run_id}: nothing written (0 metric value(s), 0 param(s), 0 tag(s))"), line
        assert "status kept FINISHED (the store's, set " in line and "newer than the journal's KILLED at" in line
        assert "2 tag(s) kept (newer in the store)" in line


def test_a_pruned_trial_stays_killed_after_any_number_of_replays(client, tmp_path):
    run_id, journal = new_run(client), tmp_path / JOURNAL_NAME
    fit = Attempt(client, run_id, journal)
    fit.metrics(range(3))
    fit.end("FINISHED")  # the trial's fit ended, then the sweep pruned it
    client.set_tag(run_id, "loopwise.sweep.pruned", "epoch 0")
    client.set_terminated(run_id, status="KILLED")
    before = record_of(client, run_id)
    assert before["status"] == "KILLED"
    for _ in range(3):
        summary = replay(read_journal(journal), client, run_id)
        assert record_of(client, run_id) == before
        assert summary.status is None and "status kept KILLED" in summary.describe()


def test_an_old_journal_without_times_never_overwrites_what_the_store_holds(client, tmp_path):
    """Entries of journals written before every entry was timed: params and tags carry no time."""
    run_id = new_run(client)  # RUNNING, nothing newer than the journal: only the untimed entries are in question
    client.log_param(run_id, "lr", "0.1")
    client.set_tag(run_id, "team", "new")
    lines = [
        {"kind": "start", "time": 1000, "host": socket.gethostname(), "pid": os.getpid()},
        {"kind": "params", "values": {"lr": "0.5", "batch_size": "32"}},
        {"kind": "tags", "values": {"team": "old", "loopwise.checkpoint_step": "3"}},
        {"kind": "metrics", "step": 0, "time": 1001, "values": {"loss": 1.0}},
        {"kind": "status", "status": "FINISHED", "time": 2000},
    ]
    (tmp_path / JOURNAL_NAME).write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = replay(read_journal(tmp_path / JOURNAL_NAME), client, run_id)
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.1", "batch_size": "32"}  # a held param never changes; a missing one is written
    assert run.data.tags["team"] == "new" and run.data.tags["loopwise.checkpoint_step"] == "3"
    assert (summary.params, summary.params_kept, summary.tags, summary.tags_kept) == (1, 1, 1, 1)
    assert (run.info.status, run.info.end_time, summary.status) == ("FINISHED", 2000, "FINISHED")
    again = replay(read_journal(tmp_path / JOURNAL_NAME), client, run_id)
    assert again.wrote_nothing() and "nothing written" in again.describe()


def test_a_store_that_failed_mid_run_gets_the_journals_newer_tags_metrics_and_end(client, tmp_path):
    run_id, journal = new_run(client), tmp_path / JOURNAL_NAME
    attempt = Attempt(client, run_id, journal)
    attempt.tags(**{"loopwise.checkpoint_step": "2"})
    attempt.metrics(range(3))
    attempt.client = None  # the store stops answering: the journal alone goes on
    attempt.write("tags", values={"loopwise.checkpoint_step": "5"})
    for step in range(3, 6):
        attempt.write("metrics", step=step, time=int(time.time() * 1000), values={"train/loss": 0.1})
    attempt.write("status", status="FINISHED", time=int(time.time() * 1000))
    attempt.journal.close()
    summary = replay(read_journal(journal), client, run_id)
    run = client.get_run(run_id)
    assert (run.info.status, run.data.tags["loopwise.checkpoint_step"]) == ("FINISHED", "5")
    assert sorted(m.step for m in client.get_metric_history(run_id, "train/loss")) == list(range(6))
    assert (summary.metric_values, summary.metric_values_held, summary.tags, summary.status) == (3, 3, 1, "FINISHED")
    assert not summary.continued_elsewhere
    before = record_of(client, run_id)
    again = replay(read_journal(journal), client, run_id)
    assert again.wrote_nothing() and record_of(client, run_id) == before


def test_a_run_going_on_elsewhere_is_not_ended_by_an_older_journal(client, tmp_path):
    run_id, journal = new_run(client), tmp_path / JOURNAL_NAME
    here = Attempt(client, run_id, journal)
    here.metrics(range(3))
    here.end("KILLED")
    client.update_run(run_id, status="RUNNING")  # resumed in another directory, still training
    Attempt(client, run_id).metrics(range(3, 5))
    summary = replay(read_journal(journal), client, run_id)
    assert client.get_run(run_id).info.status == "RUNNING" and summary.status is None
    assert summary.continued_elsewhere and "status kept RUNNING (the store's, it holds values logged at" in (
        summary.describe())


def test_a_killed_that_a_later_command_guessed_yields_to_the_status_the_journal_wrote(client, tmp_path):
    """The store failed before the run's end was written; a later command saw the run RUNNING, its process gone, and
    ended it KILLED (``loopwise.abandoned``). The journal knows the process ended it FINISHED."""
    run_id, journal, pid, host = new_run(client), tmp_path / JOURNAL_NAME, os.getpid(), socket.gethostname()
    attempt = Attempt(client, run_id, journal)
    attempt.tags(**{"loopwise.pid": str(pid), "loopwise.host": host})
    attempt.metrics(range(2))
    attempt.write("status", status="FINISHED", time=int(time.time() * 1000))  # the store did not hear it
    attempt.journal.close()
    time.sleep(0.003)
    client.set_tag(run_id, "loopwise.abandoned", f"process {pid} on {host} ended without closing the run (kill -9, "
                   "out of memory, power loss); marked KILLED by a later command.")
    client.set_terminated(run_id, "KILLED")
    summary = replay(read_journal(journal), client, run_id)
    run = client.get_run(run_id)
    assert (run.info.status, summary.status) == ("FINISHED", "FINISHED") and "loopwise.abandoned" not in run.data.tags


def test_sync_sends_no_checkpoint_of_a_folder_whose_run_went_on_elsewhere(client, tmp_path):
    """The folder's last upload failed (its ledger expects one), but the run was resumed and went on in another
    directory: its older last.ckpt must not replace the run's newer one in the store."""
    from recipes.tracking.sync import sync_journals
    from recipes.tracking.uploads import LEDGER_NAME, UploadLedger

    run_id = new_run(client)
    folder = tmp_path / "checkpoints" / "e" / run_id
    here = Attempt(client, run_id, folder / JOURNAL_NAME)
    here.metrics(range(3))
    here.end("KILLED")
    (folder / "last.ckpt").write_bytes(b"older")
    UploadLedger(folder / LEDGER_NAME).expect()  # an upload was due and never went through
    client.update_run(run_id, status="RUNNING")
    Attempt(client, run_id).metrics(range(3, 6))  # resumed elsewhere
    client.set_terminated(run_id, "FINISHED")
    (line,) = sync_journals(tmp_path / "checkpoints", client.tracking_uri)
    assert "checkpoints not uploaded (the run went on elsewhere after this journal)" in line, line
    assert client.list_artifacts(run_id, "checkpoints") == [] and client.get_run(run_id).info.status == "FINISHED"


# --- end to end: two working directories sharing one store --------------------------------------------------------


class StopInSecondEpoch(Callback):
    """SIGTERM to this process in the second epoch (the recipe saves last.ckpt and ends the run KILLED)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)


def recipes(directory: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return preloaded_run([sys.executable, "-m", "recipes", *args], cwd=directory, env=env, timeout=300)


@pytest.mark.slow
def test_recipes_sync_in_a_stale_directory_leaves_a_run_finished_elsewhere_as_it_is(tmp_path, capsys, migrated_store):
    shared, a, b = tmp_path / "store", tmp_path / "a", tmp_path / "b"
    for folder in (shared, a, b):
        folder.mkdir()
    shared_uri = f"sqlite:///{copy_migrated_store(migrated_store, shared)}"  # both directories track to it
    env = {**recipes_env(), "MLFLOW_TRACKING_URI": shared_uri}
    tiny = ["-c", str(SPIRAL), *TINY, "--mlflow_model", "false", "--trainer.max_epochs", "3"]
    stopped = recipes(a, env, "fit", *tiny, "--trainer.callbacks+=tests.tracking.test_sync_merge.StopInSecondEpoch")
    assert stopped.returncode == 143, stopped.stdout[-2000:] + stopped.stderr[-2000:]
    (journal,) = (a / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}")
    run_id = journal.parent.name
    client = mlflow.MlflowClient(shared_uri)
    assert client.get_run(run_id).info.status == "KILLED"
    resumed = recipes(b, env, "fit", *tiny, "--ckpt_path", f"mlflow:{run_id}/last")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    before = record_of(client, run_id)
    assert before["status"] == "FINISHED" and [s for s, _, _ in before["metrics"]["val/acc"]] == [2, 5, 8]
    for _ in range(2):  # `recipes sync` in A (in this process: a third start-up costs more than the sync), twice
        assert sync_main(["--checkpoints_dir", str(a / "checkpoints"), "--tracking_uri", shared_uri]) == 0
        assert record_of(client, run_id) == before  # status, end time, every tag, param and metric history
        (line,) = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("recipes sync:")]
        assert f"run {run_id}: nothing written (0 metric value(s), 0 param(s), 0 tag(s))" in line, line
        assert "status kept FINISHED (the store's, set " in line and "than the journal's KILLED at" in line, line


@pytest.mark.parametrize("scheme", ["postgresql", "http"])
def test_sync_to_a_store_that_does_not_answer_is_one_line_before_any_write(tmp_path, capsys, scheme):
    """`recipes sync --tracking_uri` names a database or server that does not answer: one line, password masked."""
    (tmp_path / "checkpoints").mkdir()
    port = free_port()  # nothing listens there
    uri = f"postgresql://team:s3cret@127.0.0.1:{port}/mlflow" if scheme == "postgresql" else f"http://127.0.0.1:{port}"
    assert sync_main(["--checkpoints_dir", str(tmp_path / "checkpoints"), "--tracking_uri", uri]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # errors on stderr, as every recipes command writes them
    assert line.startswith("recipes: error: ") and "does not answer" in line and "s3cret" not in line


def test_two_commands_replaying_one_journal_at_the_same_moment_both_succeed(client, tmp_path):
    """Every loopwise command that reads a store first replays the journals it knows of (workers of a sweep starting
    together, two ``recipes compare`` at once): the other command's insert of a journal's tag lands between this
    one's lookup and insert (``tests.insert_race``)."""
    from tests.insert_race import another_writer_inserts_first

    run_id = new_run(client)
    lines = [
        {"kind": "start", "time": 1000, "host": socket.gethostname(), "pid": os.getpid()},
        {"kind": "tags", "time": 1001, "values": {"loopwise.checkpoint_step": "3", "team": "vision"}},
        {"kind": "metrics", "step": 0, "time": 1002, "values": {"loss": 1.0}},
    ]
    (tmp_path / JOURNAL_NAME).write_text("".join(json.dumps(line) + "\n" for line in lines))
    with another_writer_inserts_first(client.tracking_uri, run_id, "loopwise.") as raced:
        summary = replay(read_journal(tmp_path / JOURNAL_NAME), client, run_id)
    assert raced == ["loopwise.checkpoint_step"] and summary.tags == 2
    run = client.get_run(run_id)
    assert run.data.tags["loopwise.checkpoint_step"] == "3" and run.data.tags["team"] == "vision"
    assert run.data.metrics == {"loss": 1.0}
