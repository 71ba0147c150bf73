"""The SQLite tracking store failing under a running fit, one suite (issue 16, item 2; issue 53, sections 2 and 5):
training goes on with one warning that says what happened to the store, the run's record is journaled next to its
checkpoints, and `recipes sync` (or a resume, or the next command that reads the store) writes it to the store,
with what the end of the run would have written (the logged model and its `loopwise.model_uri`, the confusion
matrix, who ran it). The store deleted mid-run is one fit that every assertion about it shares; a store moved aside,
one turning read-only, and the replay and failure filter underneath have tests of their own."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings
from pathlib import Path

import mlflow
import pytest
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from recipes.tracking.journal import JOURNAL_NAME, TrackingJournal, read_journal, replay
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
    "replayed_from": run.data.tags.get("loopwise.replayed_from_run"),
    "status": run.info.status,
    "val_acc_steps": sorted(m.step for m in client.get_metric_history(run.info.run_id, "val/acc")),
    "total_steps": run.data.params.get("plan.total_optimizer_steps"),
    "tags": run.data.tags,
    "artifacts": sorted(a.path for a in client.list_artifacts(run.info.run_id)),
    "model": None if model is None else {"status": str(model.status), "source_run_id": model.source_run_id},
    "user": resolve_tags()["mlflow.user"],
}))
"""


def run_in_new_process(workdir: Path, args: list[str]):
    """``python <args>`` in a process of its own (this one still holds a connection to the deleted store)."""
    return preloaded_run([sys.executable, *args], cwd=workdir, env=recipes_env(), timeout=300)


@pytest.fixture(scope="module")
def deleted_store(clean_workdir) -> dict:
    """One 3-epoch spiral fit (its MLflow model logged) whose ./mlflow.db is deleted when the first epoch ends, then
    `recipes sync` twice in new processes, the store read after each: what every test of this scenario asserts on."""
    out, err = io.StringIO(), io.StringIO()
    with clean_workdir("deleted_store") as directory:
        with warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3",
                  "--trainer.callbacks+=tests.tracking.test_store_failures.DeleteStoreAfterFirstEpoch"])  # fmt: skip
        (journal,) = (directory / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}")
        # `recipes sync` is a new command, a new process (this one still holds a connection to the deleted file)
        first = run_in_new_process(directory, ["-m", "recipes", "sync"])
        record = json.loads(run_in_new_process(directory, ["-c", READ_RECORD]).stdout)
        second = run_in_new_process(directory, ["-m", "recipes", "sync"])
        record_again = json.loads(run_in_new_process(directory, ["-c", READ_RECORD]).stdout)
    return {"directory": directory, "caught": [str(w.message) for w in caught], "out": out.getvalue(),
            "err": err.getvalue(), "journal": journal, "first": first, "record": record, "second": second,
            "record_again": record_again}


@pytest.mark.slow
def test_a_store_deleted_mid_run_loses_nothing_after_recipes_sync(deleted_store):
    store_warnings = [w for w in deleted_store["caught"] if "the tracking store stopped accepting writes" in w]
    assert len(store_warnings) == 1  # one warning, not a traceback per write
    assert "Traceback" not in deleted_store["err"] and "recipes sync" in deleted_store["out"]
    journal = deleted_store["journal"]
    assert (journal.parent / "last.ckpt").is_file()  # training went on to the end
    first = deleted_store["first"]
    assert first.returncode == 0 and "recreated from" in first.stdout, first.stderr[-2000:]
    record = deleted_store["record"]
    assert record["replayed_from"] == journal.parent.name and record["status"] == "FINISHED"
    assert record["val_acc_steps"] == [21, 43, 65]  # every epoch's validation, those after the store vanished too
    assert record["total_steps"] == "66"
    second = deleted_store["second"]
    assert "0 metric value(s), 0 param(s), 0 tag(s)" in second.stdout  # a second sync writes nothing twice


@pytest.mark.slow
def test_a_run_whose_store_was_deleted_gets_its_model_figure_and_user_from_recipes_sync(deleted_store):
    (warning,) = [w for w in deleted_store["caught"] if "stopped accepting writes" in w]
    assert f"{deleted_store['directory'] / 'mlflow.db'} was deleted (the file is missing)" in warning, warning
    assert "read-only" not in warning and "readonly" not in warning
    synced = deleted_store["first"]
    assert synced.returncode == 0, synced.stdout + synced.stderr[-3000:]
    record = deleted_store["record"]
    tags = record["tags"]
    assert tags["loopwise.replayed_from_run"] and record["run_id"] != tags["loopwise.replayed_from_run"]
    assert tags["mlflow.user"] == record["user"]  # who ran it, not nobody (`by @host` in recipes compare)
    assert tags["loopwise.model_uri"].startswith("models:/")
    assert record["model"] == {"status": "READY", "source_run_id": record["run_id"]}
    assert {"config.yaml", "confusion_matrix_val.png", "checkpoints"} <= set(record["artifacts"])
    again = deleted_store["second"]
    assert "0 replayed, 1 already complete" in again.stdout or "nothing written" in again.stdout, again.stdout
    assert deleted_store["record_again"]["tags"] == tags  # one model, logged once


class StoreMovedAsideAfterFirstEpoch(Callback):
    """Moves ./mlflow.db aside when the first training epoch ends (SQLite refuses every later write to a moved file);
    the test puts it back after the fit, as a person restoring a store from a backup would."""

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            Path("mlflow.db").rename("mlflow.db.aside")


@pytest.mark.slow
def test_the_next_command_that_reads_the_store_completes_the_end_of_a_run_it_missed(workdir):
    moved_aside = "--trainer.callbacks+=tests.tracking.test_store_failures.StoreMovedAsideAfterFirstEpoch"
    fit = run_in_new_process(workdir, ["-m", "recipes", "fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2",
                                       moved_aside])
    assert fit.returncode == 0 and "MLflow model not logged" in fit.stderr, fit.stderr[-3000:]
    (workdir / "mlflow.db.aside").replace(workdir / "mlflow.db")  # the store is back, the end of the run not in it
    before = json.loads(run_in_new_process(workdir, ["-c", READ_RECORD]).stdout)
    assert "loopwise.model_uri" not in before["tags"] and "confusion_matrix_val.png" not in before["artifacts"]
    compare = run_in_new_process(workdir, ["-m", "recipes", "compare", "--experiment", "spiral_mlp"])
    assert compare.returncode == 0, compare.stdout + compare.stderr[-3000:]
    after = json.loads(run_in_new_process(workdir, ["-c", READ_RECORD]).stdout)
    assert after["run_id"] == before["run_id"] and after["tags"]["loopwise.model_uri"].startswith("models:/")
    assert after["model"] == {"status": "READY", "source_run_id": after["run_id"]}
    assert "confusion_matrix_val.png" in after["artifacts"]
    assert f"{after['user']}@" in compare.stdout  # `by user@host` (mlflow.user), not `by @host`


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
