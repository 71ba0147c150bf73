"""Several recipes started at once on one embedded SQLite store (``sqlite:///.../mlflow.db``).

MLflow creates and migrates the SQLite database the first time a client opens it. Two processes that both find it
missing (or old) both run the migrations, and one of them dies with ``table _alembic_tmp_... already exists`` or
``Online migration expected to match one row``; two processes that both find the experiment missing both create it,
and one dies with ``RESOURCE_ALREADY_EXISTS``. Once the tables and the experiment exist, concurrent writes are safe:
MLflow sets ``PRAGMA busy_timeout = 20000`` on every SQLite session, so a writer waits up to 20 s for the other's
transaction instead of failing with ``database is locked``.

``prepare_sqlite_store`` creates the database and ``ensure_experiment`` the experiment (when a run is about to be
created in it), each under an exclusive ``flock`` on the database's directory, so the first process creates and the
others wait, then find everything in place. Other tracking URIs (a server, another
database) are left alone: a server serializes this itself.

The first start is atomic: MLflow creates its tables in a hidden temporary file next to the database, which is moved
into place (``os.replace``) only once complete. A SIGTERM, Ctrl+C or kill during the creation (several seconds on a
slow disk) used to leave a half-made ``mlflow.db`` that every later command refused (``duplicate column name: step``,
``table secrets already exists``); now it leaves no database, and the next command creates it. Temporary files of
an interrupted creation are removed by the next one (under the lock: nobody else is creating).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from recipes.tracking.experiment_kind import create_experiment
from recipes.tracking.quiet_mlflow import STORE_CREATION, quiet_info

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
        remove_interrupted_creations(database)
        if not database.exists():
            create_database_atomically(database.resolve())
        client = MlflowClient(uri)  # opens the store: upgrades the tables of an older MLflow
        if experiment:
            create_missing_experiment(client, experiment)
        else:
            client.search_experiments(max_results=1)


CREATING_SUFFIX = ".creating"


def create_database_atomically(database: Path) -> None:
    """Create MLflow's tables in a temporary file next to ``database`` and move it into place when complete; call it
    under ``directory_lock``. Leftovers of an interrupted creation are removed first."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    temporary = database.with_name(f".{database.name}.{os.getpid()}{CREATING_SUFFIX}")
    try:
        with quiet_info(*STORE_CREATION):  # MLflow's "Creating initial MLflow database tables..." lines
            MlflowClient(f"{SQLITE_PREFIX}{temporary}").search_experiments(max_results=1)  # creates every table
        os.replace(temporary, database)
    finally:
        temporary.unlink(missing_ok=True)
        temporary.with_name(temporary.name + "-journal").unlink(missing_ok=True)


def remove_interrupted_creations(database: Path) -> None:
    """Remove the temporary files (and SQLite journals) of creations that a signal or a kill interrupted; call it
    under ``directory_lock``, when no other process can be creating."""
    for leftover in database.parent.glob(f".{database.name}.*{CREATING_SUFFIX}*"):
        leftover.unlink(missing_ok=True)


def ensure_experiment(uri: str, name: str) -> None:
    """The experiment ``name`` in the store at ``uri``, created as a model-development experiment when missing, at
    the moment a run is about to be created in it (not before: a command that fails before then leaves no empty
    experiment). On a SQLite store under ``directory_lock`` (recipes started together on one ``mlflow.db`` take
    turns); on a server, a creation that loses a race with another client's finds the experiment made."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    database = sqlite_database_path(uri)
    with directory_lock(database.parent.resolve()) if database is not None else contextlib.nullcontext():
        create_missing_experiment(MlflowClient(uri), name)


def create_missing_experiment(client: Any, name: str) -> None:
    """Create the experiment ``name`` as a model-development experiment unless it exists (call it under the SQLite
    store's ``directory_lock``); a creation that loses a race with another client (a server) finds it made."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    if client.get_experiment_by_name(name) is not None:
        return
    try:
        create_experiment(client, name)  # a model-development experiment in MLflow's UI
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


__all__ = ["create_database_atomically", "create_missing_experiment", "directory_lock", "ensure_experiment",
           "prepare_sqlite_store", "sqlite_database_path"]
