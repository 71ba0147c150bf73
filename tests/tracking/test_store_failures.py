"""A tracking store that fails mid-run costs nothing (issue 16, item 2): training goes on with one warning, the run's
record is journaled next to its checkpoints, and `recipes sync` (or a resume) writes it to the store."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import mlflow
import pytest
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from recipes.tracking.journal import JOURNAL_NAME, TrackingJournal, read_journal, replay
from tests.preloaded_python import preloaded_run
from tests.conftest import SPIRAL, recipes_env


class DeleteStoreAfterFirstEpoch(Callback):
    """Deletes ./mlflow.db when the first training epoch ends (the store vanishes under a running fit)."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            import pathlib

            pathlib.Path("mlflow.db").unlink()


@pytest.mark.slow
def test_a_store_deleted_mid_run_loses_nothing_after_recipes_sync(workdir, capsys):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3", "--mlflow_model", "false",
              "--trainer.callbacks+=tests.tracking.test_store_failures.DeleteStoreAfterFirstEpoch"])  # fmt: skip
    store_warnings = [w for w in caught if "the tracking store stopped accepting writes" in str(w.message)]
    assert len(store_warnings) == 1  # one warning, not a traceback per write
    out = capsys.readouterr()
    assert "Traceback" not in out.err and "recipes sync" in out.out
    (journal,) = (workdir / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}")
    assert (journal.parent / "last.ckpt").is_file()  # training went on to the end
    # `recipes sync` is a new command, a new process (this one still holds a connection to the deleted file)
    first = run_in_new_process(workdir, ["-m", "recipes", "sync"])
    assert first.returncode == 0 and "recreated from" in first.stdout, first.stderr[-2000:]
    record = json.loads(run_in_new_process(workdir, ["-c", READ_RECORD]).stdout)
    assert record["replayed_from"] == journal.parent.name and record["status"] == "FINISHED"
    assert record["val_acc_steps"] == [21, 43, 65]  # every epoch's validation, those after the store vanished too
    assert record["total_steps"] == "66"
    second = run_in_new_process(workdir, ["-m", "recipes", "sync"])
    assert "0 metric value(s), 0 param(s), 0 tag(s)" in second.stdout  # a second sync writes nothing twice


READ_RECORD = """
import json, mlflow
client = mlflow.MlflowClient("sqlite:///mlflow.db")
(run,) = client.search_runs([client.get_experiment_by_name("spiral_mlp").experiment_id])
print(json.dumps({
    "replayed_from": run.data.tags.get("loopwise.replayed_from_run"),
    "status": run.info.status,
    "val_acc_steps": sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/acc")),
    "total_steps": run.data.params.get("plan.total_optimizer_steps"),
}))
"""


def run_in_new_process(workdir, args: list[str]) -> subprocess.CompletedProcess:
    env = recipes_env()
    return preloaded_run([sys.executable, *args], cwd=workdir, env=env, timeout=300)


def test_replay_writes_only_what_the_store_lacks(tmp_path):
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    for step in (0, 1):
        client.log_metric(run_id, "loss", 1.0 / (step + 1), step=step)
    journal = TrackingJournal(tmp_path / JOURNAL_NAME)
    for step in range(4):
        journal.record("metrics", step=step, time=1000 + step, values={"loss": 1.0 / (step + 1)})
    journal.record("params", values={"lr": "0.1"})
    journal.record("status", status="FINISHED", time=5000)
    journal.close()
    first = replay(read_journal(tmp_path / JOURNAL_NAME), client, run_id)
    assert (first.metric_values, first.params, first.status) == (2, 1, "FINISHED")
    assert sorted(m.step for m in client.get_metric_history(run_id, "loss")) == [0, 1, 2, 3]
    again = replay(read_journal(tmp_path / JOURNAL_NAME), client, run_id)
    assert (again.metric_values, again.params, again.status) == (0, 0, None)
    (tmp_path / JOURNAL_NAME).write_text((tmp_path / JOURNAL_NAME).read_text() + '{"kind": "metr')  # a cut last line
    assert len(read_journal(tmp_path / JOURNAL_NAME)) == 7  # the "start" entry, 6 records


READ_ONLY_METHODS = ("log_batch", "set_tag", "log_param", "update_run_info", "set_terminated")


REFUSING = {"on": False}  # the store refuses writes while this is on


def refusing(original):
    """``original`` (a ``SqlAlchemyStore`` write method) refusing while ``REFUSING["on"]``: whatever took a reference
    to the patched method while the store was "read-only" (MLflow's asynchronous queue binds ``store.log_batch`` when
    a store is built, and MLflow caches stores) writes normally again once it is off, in this test or a later one."""

    def refuse(*args, **kwargs):
        if REFUSING["on"]:
            from mlflow.exceptions import MlflowException

            raise MlflowException("(sqlite3.OperationalError) attempt to write a readonly database")
        return original(*args, **kwargs)

    return refuse


class StoreTurnsReadOnlyAfterFirstEpoch(Callback):
    """From the end of the first epoch on, the SQL store refuses every write as a read-only SQLite file does (a chmod
    cannot show it here: the tests may run as root, which file modes do not stop)."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch != 0:
            return
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        for name in READ_ONLY_METHODS:
            if hasattr(SqlAlchemyStore, name) and not hasattr(SqlAlchemyStore, f"_writable_{name}"):
                original = getattr(SqlAlchemyStore, name)
                setattr(SqlAlchemyStore, f"_writable_{name}", original)
                setattr(SqlAlchemyStore, name, refusing(original))
        REFUSING["on"] = True


def make_writable_again() -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    REFUSING["on"] = False
    for name in READ_ONLY_METHODS:
        original = getattr(SqlAlchemyStore, f"_writable_{name}", None)
        if original is not None:
            setattr(SqlAlchemyStore, name, original)
            delattr(SqlAlchemyStore, f"_writable_{name}")


@pytest.mark.slow
def test_a_store_that_turns_read_only_then_works_again_gets_the_same_run_complete(workdir, capsys):
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3", "--mlflow_model", "false",
                  "--trainer.callbacks+=tests.tracking.test_store_failures.StoreTurnsReadOnlyAfterFirstEpoch"])  # fmt: skip
    finally:
        make_writable_again()  # the user fixed the file's permissions
        # the fit's process has ended by the time a user runs `recipes sync` (its exit drains MLflow's asynchronous
        # queue); in this process the queue may still hold a batch the fit queued before the store turned read-only,
        # which would land beside the sync's replay
        mlflow.flush_async_logging()
    assert len([w for w in caught if "stopped accepting writes" in str(w.message)]) == 1
    assert "Traceback" not in capsys.readouterr().err
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("spiral_mlp").experiment_id])
    assert run.info.status == "RUNNING"  # the end of the run could not be written
    assert "doctor.findings" not in run.data.tags  # nor the doctor's verdict, set at the end
    with pytest.raises(SystemExit) as exc:
        main(["sync"])
    assert exc.value.code == 0
    run = client.get_run(run.info.run_id)  # the same run, completed
    assert run.info.status == "FINISHED" and "loopwise.replayed_from_run" not in run.data.tags
    assert run.data.tags["doctor.findings"] == "none"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/acc")) == [21, 43, 65]


def test_a_late_failed_batch_of_an_earlier_run_is_not_the_current_runs_store_failing():
    """MLflow's queue of an earlier run of this process (a sweep's trial, a store that failed) may still report a batch
    it could not write after that run ended; the running fit's logger used to take it for its own store failing (one
    warning, and its record went to the journal only, though its store worked)."""
    import logging

    from recipes.tracking.failures import StoreFailureFilter

    class Owner:
        failures: list[str] = []

        def keeps_journal(self) -> bool:
            return True

        def journal_run_id(self) -> str:
            return "current"

        def store_failed(self, message: str) -> None:
            self.failures.append(message)

    owner = Owner()
    store_filter = StoreFailureFilter(logging.ERROR)
    store_filter.owner = lambda: owner

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("mlflow.utils.async_logging.async_logging_queue", logging.ERROR, __file__, 1, message,
                                 None, None)

    other = record("Run Id earlier: Failed to log run data: Exception: attempt to write a readonly database")
    assert store_filter.filter(other) is False and owner.failures == []  # quiet: that run's journal holds it
    own = record("Run Id current: Failed to log run data: Exception: attempt to write a readonly database")
    assert store_filter.filter(own) is False and len(owner.failures) == 1
    assert store_filter.filter(record("(sqlite3.OperationalError) database is locked")) is False  # no run named
