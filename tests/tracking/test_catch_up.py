"""``ServerCatchUp`` (recipes/tracking/catch_up.py): a run catches up with a store that answers again, by itself,
each metric value once, also when the run ends before the next probe. The store is a real MLflow SQLite store behind
a client that refuses every call while ``away`` is set, as a stopped server's client does."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from recipes.tracking.catch_up import ServerCatchUp
from recipes.tracking.journal import TrackingJournal, read_journal
from tests.conftest import copy_migrated_store

REFUSED = ("API request to http://127.0.0.1:5000/api/2.0/mlflow/runs/get failed with exception HTTPConnectionPool("
           "host='127.0.0.1', port=5000): Max retries exceeded (Caused by NewConnectionError(\"Failed to establish a "
           "new connection: [Errno 111] Connection refused\"))")


class ServerClient:
    """A real client, refusing every call while ``away``; ``during_first_write`` runs once, before the first
    ``log_batch`` (the training thread recording while the catch-up replays)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.away, self.during_first_write = client, True, None

    def __getattr__(self, name):
        method = getattr(self.client, name)
        if not callable(method):  # tracking_uri
            return method

        def call(*args, **kwargs):
            if self.away:
                raise MlflowException(REFUSED)
            if name == "log_batch" and self.during_first_write is not None:
                action, self.during_first_write = self.during_first_write, None
                action()
            return method(*args, **kwargs)

        return call


@pytest.fixture
def run(tmp_path: Path, migrated_store: Path):
    client = MlflowClient(f"sqlite:///{copy_migrated_store(migrated_store, tmp_path)}")
    run_id = client.create_run(client.create_experiment("e", artifact_location=str(tmp_path / "art"))).info.run_id
    journal = TrackingJournal(tmp_path / run_id / "tracking-journal.jsonl")
    return client, run_id, journal


def catch_up_of(server: ServerClient, run_id: str, journal: TrackingJournal, resumed: list, failed: list,
                interval_s: float = 3600) -> ServerCatchUp:
    def resume():
        resumed.append(time.monotonic())
        return read_journal(journal.path)

    return ServerCatchUp(lambda: server, run_id, journal.path, "http://127.0.0.1:5000", resume, failed.append,
                         interval_s=interval_s)


def steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def test_a_store_back_gets_the_journal_each_value_once_also_what_was_recorded_during_the_catch_up(run, capsys):
    client, run_id, journal = run
    client.log_metric(run_id, "val/acc", 0.5, step=0)  # written before the outage, and journaled
    journal.record("metrics", step=0, values={"val/acc": 0.5})
    for step in (1, 2, 3):  # the outage: journal only
        journal.record("metrics", step=step, values={"val/acc": 0.5 + step / 10, "train/loss": 1.0 / step})
    journal.record("tags", values={"loopwise.checkpoint_step": "3"})
    server, resumed, failed = ServerClient(client), [], []
    catch_up = catch_up_of(server, run_id, journal, resumed, failed)
    catch_up.start()
    assert catch_up.try_now() is False and resumed == []  # still away: the logger keeps writing to the journal

    server.away = False
    server.during_first_write = lambda: journal.record("metrics", step=4, values={"val/acc": 0.95})
    assert catch_up.try_now() is True
    assert len(resumed) == 1 and failed == []
    assert steps(client, run_id, "val/acc") == [0, 1, 2, 3, 4]  # step 0 not twice, step 4 (recorded meanwhile) once
    assert steps(client, run_id, "train/loss") == [1, 2, 3]
    assert client.get_run(run_id).data.tags["loopwise.checkpoint_step"] == "3"
    (line,) = capsys.readouterr().err.splitlines()  # a notice: stderr
    assert line.startswith("recipes: the tracking server at http://127.0.0.1:5000 answers again (away for ")
    assert "wrote the 7 metric value(s), 0 param(s) and 1 tag(s) of the outage" in line
    assert catch_up.try_now() is True and len(resumed) == 1  # caught up: nothing more to do
    catch_up.finish()


def test_the_end_of_the_run_catches_up_with_a_store_back_since_the_last_probe(run, capsys):
    client, run_id, journal = run
    journal.record("metrics", step=7, values={"val/acc": 0.9})
    server, resumed, failed = ServerClient(client), [], []
    catch_up = catch_up_of(server, run_id, journal, resumed, failed)  # the next probe in an hour
    catch_up.start()
    server.away = False
    catch_up.finish()
    assert steps(client, run_id, "val/acc") == [7] and len(resumed) == 1
    assert "answers again" in capsys.readouterr().err
    catch_up.start()  # the run has ended: no thread probes any more
    assert not [t for t in threading.enumerate() if t.name == "recipes-catch-up" and t.is_alive()]


def test_a_store_still_away_at_the_end_leaves_the_journal_for_recipes_sync(run, capsys):
    client, run_id, journal = run
    journal.record("metrics", step=7, values={"val/acc": 0.9})
    server, resumed, failed = ServerClient(client), [], []
    catch_up = catch_up_of(server, run_id, journal, resumed, failed, interval_s=0.05)
    catch_up.start()
    time.sleep(0.3)  # a few probes, all refused
    started = time.monotonic()
    catch_up.finish()
    assert time.monotonic() - started < 1
    assert resumed == [] and steps(client, run_id, "val/acc") == [] and capsys.readouterr().err == ""


def test_the_background_thread_catches_up_within_its_interval(run, capsys):
    client, run_id, journal = run
    journal.record("metrics", step=1, values={"val/acc": 0.9})
    server, resumed, failed = ServerClient(client), [], []
    catch_up = catch_up_of(server, run_id, journal, resumed, failed, interval_s=0.1)
    catch_up.start()
    time.sleep(0.3)
    back = time.monotonic()
    server.away = False
    deadline = back + 10
    while not resumed and time.monotonic() < deadline:
        time.sleep(0.02)
    assert resumed and resumed[0] - back < 2, "no catch-up within the probe interval"
    time.sleep(0.3)
    assert len(resumed) == 1 and steps(client, run_id, "val/acc") == [1]  # once, and the thread has stopped
    assert not [t for t in threading.enumerate() if t.name == "recipes-catch-up" and t.is_alive()]
    catch_up.finish()


def test_a_logged_value_has_one_time_in_the_journal_and_in_the_store(tmp_path, migrated_store, monkeypatch):
    """``RecipeLogger.log_metrics`` gives the journal entry and the held value one time, however slowly the clock is
    read: a value written from both (a replay racing the writer) is one row of a SQL store, whose key includes it."""
    import itertools

    from recipes.tracking.logger import RecipeLogger

    logger = RecipeLogger(experiment_name="e",
                          tracking_uri=f"sqlite:///{copy_migrated_store(migrated_store, tmp_path)}")
    logger.keep_journal(tmp_path / "checkpoints")
    run_id = logger.run_id
    clock = itertools.count(1_795_000_000_000)  # one millisecond further at every reading
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: next(clock) / 1000)
        logger.log_metrics({"val/acc": 0.5}, step=3)
    logger.flush_metrics()
    (entry,) = [e for e in read_journal(tmp_path / "checkpoints" / run_id / "tracking-journal.jsonl")
                if e["kind"] == "metrics"]
    (stored,) = logger.experiment.get_metric_history(run_id, "val/acc")
    assert stored.timestamp == entry["time"]
