"""Several recipes started at once on one embedded SQLite store (``sqlite:///.../mlflow.db``).

MLflow creates and migrates the SQLite database the first time a client opens it. Two processes that both find it
missing (or old) both run the migrations, and one of them dies with ``table _alembic_tmp_... already exists`` or
``Online migration expected to match one row``; two processes that both find the experiment missing both create it,
and one dies with ``RESOURCE_ALREADY_EXISTS``. Once the tables and the experiment exist, concurrent writes are safe:
MLflow sets ``PRAGMA busy_timeout = 20000`` on every SQLite session, so a writer waits up to 20 s for the other's
transaction instead of failing with ``database is locked``.

``prepare_sqlite_store`` does the two one-time steps under an exclusive ``flock`` on the database's directory, so the
first process creates and the others wait, then find everything in place. Other tracking URIs (a server, another
database) are left alone: a server serializes this itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

SQLITE_PREFIX = "sqlite:///"


def sqlite_database_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (``None`` for other URIs and in-memory databases)."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    path = uri[len(SQLITE_PREFIX) :].split("?", 1)[0]
    if not path or path == ":memory:":
        return None
    return Path(path)


@contextlib.contextmanager
def directory_lock(directory: Path) -> Iterator[None]:
    """An exclusive advisory lock (``flock``) on ``directory``, held for the ``with`` block; a no-op where ``fcntl``
    does not exist (Windows)."""
    try:
        import fcntl  # noqa: PLC0415
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def prepare_sqlite_store(uri: str, experiment: str | None) -> None:
    """Create (or migrate) the SQLite tracking database of ``uri`` and the experiment ``experiment`` under a lock, so
    that recipes started at the same time on the same ``mlflow.db`` do not race each other. Other URIs: nothing."""
    database = sqlite_database_path(uri)
    if database is None:
        return
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    directory = database.parent.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    with directory_lock(directory):
        client = MlflowClient(uri)  # opens the store: creates or upgrades the tables
        if experiment:
            if client.get_experiment_by_name(experiment) is None:
                client.create_experiment(experiment)
        else:
            client.search_experiments(max_results=1)


__all__ = ["directory_lock", "prepare_sqlite_store", "sqlite_database_path"]
