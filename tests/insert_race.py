"""Another writer's insert landed between MLflow's lookup of a tag and its insert of it.

MLflow's ``set_tag`` looks a tag up, then inserts it, not atomically: a process whose tag another process inserted
in between fails with ``UNIQUE constraint failed: tags.key, tags.run_uuid``. Its ``log_batch`` tries again and updates
the row. Tests of writes that several processes make to one run (the workers of one sweep, two commands replaying
one journal) land the other process's insert in that gap, deterministically."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy
import sqlalchemy.orm
from mlflow.store.tracking.dbmodels.models import SqlTag
from mlflow.tracking import MlflowClient


@contextmanager
def another_writer_inserts_first(uri: str, run_id: str, prefix: str) -> Iterator[list[str]]:
    """Right before this process inserts a new tag of ``run_id`` whose key starts with ``prefix``, another client
    inserts the same tag (once); the list of the keys it raced, filled in as it happens."""
    other, raced = MlflowClient(uri), []

    def insert_first(session, flush_context, instances) -> None:
        new = sorted(o.key for o in session.new if isinstance(o, SqlTag) and o.run_uuid == run_id
                     and o.key.startswith(prefix))
        if new and not raced:
            raced.append(new[0])
            other.set_tag(run_id, new[0], "the other writer's")

    sqlalchemy.event.listen(sqlalchemy.orm.Session, "before_flush", insert_first)
    try:
        yield raced
    finally:
        sqlalchemy.event.remove(sqlalchemy.orm.Session, "before_flush", insert_first)
