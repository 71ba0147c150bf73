"""The journal is the write-ahead log (issue 32, point 1): a checkpoint save fsyncs the journal and never waits for
the store on the training thread; after a kill -9 the store may be behind, and the next `recipes compare` (or the
resume) replays the journal, so the run's record in the store is the journal's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from recipes.checkpoints.run_stamp import CHECKPOINT_STEP_TAG, journaled_checkpoint_step
from recipes.cli import main
from recipes.compare.command import main as compare_main
from recipes.tracking import write_behind
from recipes.tracking.journal import JOURNAL_NAME, JournalRecord, TrackingJournal, read_journal
from tests.conftest import REPO, SPIRAL, mlflow_client, runs_of
from tests.preloaded_python import preloaded_run

THREE_EPOCHS = ["--trainer.max_epochs", "3", "--mlflow_model", "false"]

KILL = textwrap.dedent(
    """
    import os
    import signal

    from lightning.pytorch.callbacks import Callback


    class KillAt(Callback):
        '''SIGKILL this process at batch ``batch`` of epoch ``epoch`` (0-based): right after the save of the epoch
        before when ``batch`` is 0.'''

        def __init__(self, epoch: int = 2, batch: int = 0) -> None:
            self.epoch, self.batch = epoch, batch

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.current_epoch == self.epoch and batch_idx == self.batch:
                os.kill(os.getpid(), signal.SIGKILL)
    """
)


def store_history(directory: Path, run_id: str) -> dict[tuple[str, int], list[float]]:
    """Every (metric, step) of the run in the store with all the values logged there (MLflow keeps every write)."""
    client = mlflow_client(directory)
    history: dict[tuple[str, int], list[float]] = {}
    for key in client.get_run(run_id).data.metrics:
        if key.startswith("system/"):
            continue
        for metric in client.get_metric_history(run_id, key):
            history.setdefault((key, metric.step), []).append(metric.value)
    return history


def once(history: dict[tuple[str, int], list[float]]) -> dict[tuple[str, int], float]:
    """``history`` with one value per (metric, step), checking that no step was written twice with different values
    and none but ``epoch`` twice at all (Lightning logs ``epoch`` with the train and the validation metrics of an
    epoch's last step, in both the journal and the store, the old code's too)."""
    twice = sorted(key_step for key_step, values in history.items() if len(values) > 1 and key_step[0] != "epoch")
    assert twice == [], f"written more than once: {twice}"
    assert all(len(set(values)) == 1 for values in history.values())
    return {key_step: values[0] for key_step, values in history.items()}


def journal_history(directory: Path, run_id: str) -> dict[tuple[str, int], float]:
    """Every (metric, step) of the run's journal with its value (the first logged, as a replay writes it)."""
    path = directory / "checkpoints" / "spiral_mlp" / run_id / JOURNAL_NAME
    record = JournalRecord.of(read_journal(path), None, run_id)
    return {key_step: value for key_step, (value, _) in record.metrics.items()}


def test_a_checkpoint_save_never_writes_the_store_on_the_training_thread(workdir, monkeypatch) -> None:
    """Inside every checkpoint save of a fit, the training thread makes no synchronous metric write, no flush of
    MLflow's queue (the old code wrote the held metrics with one synchronous log_batch and flushed the queue), no
    store write at all unless the held values are due (the 5 s rule: stop 45 stopped queuing them at every save), and
    does not wait for the journal's fsync, which the save still starts; the run's record is complete at its end."""
    import mlflow
    from lightning.pytorch import Trainer
    from mlflow.tracking import MlflowClient

    saving = threading.local()
    in_save: list[tuple[str, bool, str]] = []  # (call, synchronous, thread) made during a checkpoint save
    saves = []
    saves_now: list[bool] = []  # non-empty while the training thread is inside a save
    save, log_batch, flush = Trainer.save_checkpoint, MlflowClient.log_batch, mlflow.flush_async_logging

    def spy_save(self, *args, **kwargs):
        saving.on = True
        saves.append(self.global_step)
        saves_now.append(True)
        try:
            return save(self, *args, **kwargs)
        finally:
            saving.on = False
            saves_now.clear()

    def spy_log_batch(self, run_id, metrics=(), *args, **kwargs):
        if getattr(saving, "on", False) and metrics:
            in_save.append(("log_batch", bool(kwargs.get("synchronous", True)), threading.current_thread().name))
        return log_batch(self, run_id, metrics, *args, **kwargs)

    def spy_flush(*args, **kwargs):
        if getattr(saving, "on", False):
            in_save.append(("flush_async_logging", True, threading.current_thread().name))
        return flush(*args, **kwargs)

    fsyncs: list[tuple[bool, bool]] = []  # the journal's fsyncs: (on its worker thread, during a save)
    fsync = os.fsync

    def spy_fsync(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(JOURNAL_NAME):
            fsyncs.append((threading.current_thread().name.startswith("loopwise-journal-fsync"), bool(saves_now)))
        return fsync(fd)

    step_tags: list[str] = []  # set_tag calls of loopwise.checkpoint_step that reached MLflow's client
    set_tag = MlflowClient.set_tag

    def spy_set_tag(self, run_id, key, value, *args, **kwargs):
        if key == CHECKPOINT_STEP_TAG:
            step_tags.append(str(value))
        return set_tag(self, run_id, key, value, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "set_tag", spy_set_tag)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    # the held values never due during the fit, however slow the machine: a save must then write nothing to the store
    monkeypatch.setattr(write_behind, "HOLD_SECONDS", 3600.0)
    monkeypatch.setattr(Trainer, "save_checkpoint", spy_save)
    monkeypatch.setattr(MlflowClient, "log_batch", spy_log_batch)
    monkeypatch.setattr(mlflow, "flush_async_logging", spy_flush)
    main(["fit", "-c", str(SPIRAL), *THREE_EPOCHS])
    assert len(saves) >= 3  # the saves of every epoch ran through the spy
    assert [call for call in in_save if call[1]] == []  # none waited for the store
    assert in_save == []  # nothing due: nothing went to the store during a save
    assert (False, True) not in fsyncs  # no save fsynced the journal on the training thread
    assert sum(worker for worker, _ in fsyncs) >= 3  # each epoch's save had its fsync, on the worker thread
    (run,) = runs_of(workdir, "spiral_mlp")
    history = once(store_history(workdir, run.info.run_id))
    assert history == journal_history(workdir, run.info.run_id) and len(history) > 20
    # the newest checkpoint's step: journaled at every save, held with the metrics, in the store by the end
    assert step_tags == []  # no MLflow call of its own (it went out in the metrics' log_batch)
    assert run.data.tags[CHECKPOINT_STEP_TAG] == str(saves[-1])
    assert journaled_checkpoint_step(workdir / "checkpoints", "spiral_mlp", run.info.run_id) == str(saves[-1])


@pytest.mark.slow
def test_after_kill_9_right_after_a_save_compare_replays_the_journal_and_the_resume_completes_it(workdir, capsys) -> None:
    """kill -9 right after the save of epoch 1: the store may lack what was queued; `recipes compare` (a command that
    reads the store) replays the journal: the run's history is the journal's, every key, step and value, each once,
    and the run is KILLED. The resume then ends it FINISHED with every step once (the journal's again)."""
    (workdir / "kill.py").write_text(KILL)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join([str(workdir), str(REPO)])
    killed = preloaded_run(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), *THREE_EPOCHS,
         "--trainer.callbacks+=kill.KillAt", "--trainer.callbacks.epoch", "2"],
        cwd=workdir, env=env, timeout=300,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    (run,) = runs_of(workdir, "spiral_mlp")
    run_id = run.info.run_id
    assert run.info.status == "RUNNING"  # nobody closed it
    journal = journal_history(workdir, run_id)
    assert {step for key, step in journal if key == "val/acc"} and len(journal) > 10
    compare = preloaded_run([sys.executable, "-m", "recipes", "compare"], cwd=workdir, env=env, timeout=300)
    assert compare.returncode == 0, compare.stderr[-2000:]
    assert "1 fit run" in compare.stdout
    assert once(store_history(workdir, run_id)) == journal  # every key, step and value, each once
    client = mlflow_client(workdir)
    assert client.get_run(run_id).info.status == "KILLED"
    assert "ended without closing the run" in client.get_run(run_id).data.tags["loopwise.abandoned"]
    assert f"replayed the journal of run {run_id}" in compare.stderr  # what it wrote, on stderr
    capsys.readouterr()
    assert compare_main([]) == 0
    assert "replayed the journal" not in capsys.readouterr().err  # already merged: skipped by its marker
    main(["fit", "-c", str(SPIRAL), *THREE_EPOCHS, "--ckpt_path", "last"])
    (resumed,) = runs_of(workdir, "spiral_mlp")
    assert resumed.info.status == "FINISHED"
    final = once(store_history(workdir, run_id))
    assert final == journal_history(workdir, run_id)  # each step once, the journal's value
    assert {step for key, step in final if key == "val/acc"} > {step for key, step in journal if key == "val/acc"}


def write_journal(folder: Path, pid: int, values: dict[int, float]) -> Path:
    """A journal of one attempt of process ``pid`` on this host, with metric ``a`` at the given steps."""
    import json
    import socket
    import time

    folder.mkdir(parents=True, exist_ok=True)
    now = int(time.time() * 1000)
    entries = [{"kind": "start", "time": now, "host": socket.gethostname(), "pid": pid}]
    entries += [{"kind": "metrics", "time": now, "step": step, "values": {"a": value}} for step, value in values.items()]
    path = folder / JOURNAL_NAME
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def test_a_live_run_is_left_to_its_process_and_a_merged_journal_costs_no_store_call(workdir, monkeypatch) -> None:
    """A journal whose attempt's process is alive (this one) is not replayed (its process writes those values: a
    replay beside it would write them twice); a dead one is, once; 100 journals merged before (or marked merged by
    their run's end) cost no store call."""
    import mlflow.tracking

    from recipes.tracking.pending_replay import mark_replayed, replay_pending
    from recipes.tracking.uris import default_tracking_uri

    uri = default_tracking_uri()
    client = mlflow_client(workdir)
    experiment = client.create_experiment("wal")
    live, dead = (client.create_run(experiment).info.run_id for _ in range(2))
    write_journal(workdir / "checkpoints" / "wal" / live, os.getpid(), {0: 1.0, 1: 2.0})
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    write_journal(workdir / "checkpoints" / "wal" / dead, int(gone.stdout), {0: 3.0})
    lines = replay_pending(uri, workdir / "checkpoints")
    assert [line.split(":")[0] for line in lines] == [f"run {dead}"]
    assert client.get_metric_history(live, "a") == [] and client.get_run(live).info.status == "RUNNING"
    assert [m.value for m in client.get_metric_history(dead, "a")] == [3.0]
    assert client.get_run(dead).info.status == "KILLED"
    assert replay_pending(uri, workdir / "checkpoints") == []  # merged once
    for index in range(100):  # runs that ended normally: each marked merged at its end (RecipeLogger.finalize)
        mark_replayed(write_journal(workdir / "checkpoints" / "wal" / f"run{index}", 1, {0: float(index)}), uri)

    def no_store(*args, **kwargs):
        raise AssertionError("a journal merged before was read against the store again")

    (workdir / "checkpoints" / "wal" / live / JOURNAL_NAME).unlink()  # the live run's journal is looked at each time
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", no_store)
    assert replay_pending(uri, workdir / "checkpoints") == []


def test_a_save_starts_the_journal_fsync_on_a_worker_and_close_waits_for_it(tmp_path, monkeypatch) -> None:
    """``sync_to_disk(wait=False)`` (a checkpoint save) returns while the fsync is still running on the journal's
    worker thread; ``close`` (the end of the run) returns only once that fsync is done; with nothing written since the
    last fsync there is no call at all."""
    journal = TrackingJournal(tmp_path / JOURNAL_NAME)
    journal.record("metrics", step=1, values={"a": 1.0})
    release, calls = threading.Event(), []
    fsync = os.fsync

    def slow_fsync(fd):
        calls.append(threading.current_thread().name)
        release.wait(30)
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    journal.sync_to_disk(wait=False)  # returns with the fsync blocked on the worker
    assert not release.is_set()
    journal.sync_to_disk(wait=False)  # nothing new written: no second fsync
    closer = threading.Thread(target=journal.close)
    closer.start()
    closer.join(0.5)
    assert closer.is_alive()  # close waits for the fsync in flight
    release.set()
    closer.join(30)
    assert not closer.is_alive()
    assert len(calls) == 1 and calls[0].startswith("loopwise-journal-fsync")
    assert [entry["kind"] for entry in read_journal(tmp_path / JOURNAL_NAME)] == ["start", "metrics"]


def test_a_failed_background_fsync_is_raised_by_close_which_still_closes_the_file(tmp_path, monkeypatch) -> None:
    """An fsync that failed on the worker (a disk error) is not lost: ``close`` raises it, and the file is closed."""

    def fsync_workers() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name.startswith("loopwise-journal-fsync")}

    others = fsync_workers()  # another test's journal, if any
    journal = TrackingJournal(tmp_path / JOURNAL_NAME)
    journal.record("metrics", step=1, values={"a": 1.0})

    def failing_fsync(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    journal.sync_to_disk(wait=False)
    with pytest.raises(OSError, match="Input/output error"):
        journal.close()
    assert fsync_workers() <= others  # its worker stopped
    journal.record("metrics", step=2, values={"a": 2.0})  # closed: the next entry opens the file again
    journal.close()
    assert [entry.get("step") for entry in read_journal(tmp_path / JOURNAL_NAME) if entry["kind"] == "metrics"] == [1, 2]
