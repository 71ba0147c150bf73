"""A tracking store that fails: how long one call to it may take, and the one line a person reads about it.

* **Bounded calls.** MLflow retries an HTTP request up to 7 times with exponential backoff and waits 120 s for an
  answer (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``..._BACKOFF_FACTOR``, ``..._TIMEOUT``): a server gone mid-run
  blocked every checkpoint save for minutes. ``bound_http_requests`` sets, for the recipe's process and a server
  URI, one immediate retry and a 5 s timeout (at most about 10 s for a call to a server that hangs, milliseconds for
  one that refuses connections), unless the user set them. The logger then stops writing to the store for the rest
  of the run (its journal keeps the record), so the training thread pays that at most once.
* **One line.** ``store_failure_message`` words the failure: the store, the reason (an ``[Errno 111] Connection
  refused``, not three lines of urllib3 wrapping; a read-only SQLite store said to be read-only, with what to do,
  not SQLAlchemy's ``[SQL: ...]`` and ``(Background on this error at: ...)``), cut at a word. It is warned as a
  ``TrackingStoreWarning``, which prints as ``recipes: warning: <message>`` (no file-path prefix).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from recipes.tracking.database_urls import masked_url
from recipes.tracking.sqlite_store import sqlite_database_path
from recipes.tracking.warning_lines import one_line_warnings

# the recipe process's HTTP settings for a tracking server (a value the user set in the environment wins)
BOUNDED_HTTP_SETTINGS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
    "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER": "false",  # a 429/503 with Retry-After: 60 would sleep a minute
}
READ_ONLY_MARKERS = ("readonly database", "read-only database", "read-only file system", "Read-only file system")
REASON_LIMIT = 200
# the reasons a server gave no answer, as urllib3 words them (also the word of the warning: "does not answer")
NO_ANSWER_REASONS = ("Read timed out", "Connect timeout", "timed out", "Remote end closed connection without response",
                     "Connection reset by peer", "Connection aborted", "Name or service not known")


class TrackingStoreReadOnly(ValueError):
    """The store refused to create the run because it is read-only: an input error (one line, exit 2), before
    anything is trained (without a run there is no run id to keep a journal under)."""


class TrackingStoreWarning(UserWarning):
    """The tracking store stopped accepting writes (printed as one ``recipes: warning: ...`` line)."""


def is_server_uri(uri: str) -> bool:
    """Whether ``uri`` names a tracking server (HTTP) rather than a local store."""
    return uri.startswith(("http://", "https://"))


def bound_http_requests(uri: str) -> None:
    """For a server URI, bound every MLflow HTTP call of this process (``BOUNDED_HTTP_SETTINGS``); MLflow reads
    them at each request. Values already in the environment (the user's) are kept."""
    if is_server_uri(uri):
        for key, value in BOUNDED_HTTP_SETTINGS.items():
            os.environ.setdefault(key, value)


@contextmanager
def fast_http_failures(uri: str, retries: int = 1, timeout_s: int = 15) -> Iterator[None]:
    """For an HTTP server, fail in seconds rather than after MLflow's minutes of retries, within the block; knobs the
    user set in the environment (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``) win."""
    keys = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries), "MLFLOW_HTTP_REQUEST_TIMEOUT": str(timeout_s)}
    changed = []
    if is_server_uri(uri):
        for key, value in keys.items():
            if key not in os.environ:
                os.environ[key] = value
                changed.append(key)
    try:
        yield
    finally:
        for key in changed:
            os.environ.pop(key, None)


def cut_at_word(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` if it fits in ``limit`` characters, else its words that fit and `` ...``."""
    if len(text) <= limit:
        return text
    head = text[: limit - 4].rsplit(" ", 1)[0].rstrip(" ,;:")
    return f"{head} ..."


def short_reason(err: BaseException | str) -> str:
    """The informative part of a store error: ``[Errno 111] Connection refused`` rather than three lines of
    urllib3 wrapping (``Read timed out``, ``Connection aborted`` when a server went away in the middle of a
    request, ``too many 503 error responses``); else the first line (SQLAlchemy's ``[SQL: ...]`` and background link
    dropped), cut at a word."""
    text = str(err).strip()
    errno = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if errno:
        return errno.group(0).strip()
    for marker in NO_ANSWER_REASONS:
        if marker in text:
            return marker
    responses = re.search(r"too many \d+ error responses", text)
    if responses:
        return responses.group(0)
    first = text.splitlines()[0].strip() if text else type(err).__name__
    first = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", first)
    return cut_at_word(first)


def is_read_only(err: BaseException | str) -> bool:
    """Whether the store refused a write because it (or its folder) is read-only."""
    return isinstance(err, PermissionError) or any(marker in str(err) for marker in READ_ONLY_MARKERS)


# how a SQL store words the insert of a row another writer inserted first (SQLite, PostgreSQL, MySQL)
DUPLICATE_ROW_MARKERS = ("UNIQUE constraint failed", "duplicate key value violates unique constraint", "Duplicate entry")


def lost_insert_race(err: BaseException) -> bool:
    """Whether a store refused a write because another writer inserted the same row between the store's lookup and
    its insert (MLflow's ``log_inputs`` looks a dataset up, then inserts it, not atomically: two runs of one
    experiment logging the same data at the same moment make one of them fail). Tried again, the write finds the row
    and links it."""
    return any(marker in str(err) for marker in DUPLICATE_ROW_MARKERS)


def store_failure_message(uri: str, err: BaseException | str, journal: Any, catches_up: bool = False) -> str:
    """The one warning about a store that refused a write: which store, why, that training goes on, what to do.
    ``catches_up``: a tracking server that the run catches up with by itself once it answers again
    (``recipes.tracking.catch_up``)."""
    database = sqlite_database_path(uri)
    if database is not None and not database.exists():  # SQLite says "readonly database" for a deleted file too
        return (
            f"the tracking store stopped accepting writes: {database} was deleted (the file is missing); training goes "
            f"on and the run's record is kept in {journal}. Restore the file from a backup, or let `recipes sync` "
            "create a new store after the run and recreate the run in it."
        )
    if is_read_only(err):
        where = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else uri
        return (
            f"the tracking store stopped accepting writes: {where} is read-only (attempt to write a readonly "
            "database); training goes on. Make the file and its folder writable (chmod u+w on both) or point "
            f"MLFLOW_TRACKING_URI at a writable store, then run `recipes sync`: the run's record is kept in {journal}."
        )
    reason = short_reason(err)
    if catches_up:
        failed = "does not answer" if reason in NO_ANSWER_REASONS or "[Errno" in reason else "refused a write"
        return (
            f"the tracking store stopped accepting writes: the tracking server at {masked_url(uri)} {failed} ({reason}); "
            f"training goes on, the run's record is kept in {journal} and written to the server when it answers "
            "again (`recipes sync` writes it if the run ends first)"
        )
    return (
        f"the tracking store stopped accepting writes: {masked_url(uri)} ({reason}); training goes on and the run's "
        f"record is kept in {journal}: `recipes sync` writes it (and the checkpoints) to the store once it works "
        "again (a resume of the run does too)."
    )


def read_only_at_start(uri: str) -> TrackingStoreReadOnly:
    """The error for a store that is read-only before the run exists: which store, and what to do."""
    where = uri.removeprefix("sqlite:///") if uri.startswith("sqlite:///") else uri
    return TrackingStoreReadOnly(
        f"the tracking store {where} is read-only (attempt to write a readonly database): make the file and its "
        "folder writable (chmod u+w on both), or point MLFLOW_TRACKING_URI (or trainer.logger.init_args."
        "tracking_uri) at a writable store; nothing was trained"
    )


def warn_store_failure(message: str) -> None:
    """Warn ``message`` as a ``TrackingStoreWarning``, shown as one ``recipes: warning:`` line (``warning_lines``)."""
    one_line_warnings()
    warnings.warn(message, TrackingStoreWarning, stacklevel=3)


class StoreFailureFilter(logging.Filter):
    """MLflow reports each write its store refuses on its own loggers: its asynchronous logging and its SQL store as
    an error with a traceback (once per batch, once per statement), its system metrics monitor as a warning before it
    stops. While a ``RecipeLogger`` keeps a journal (a recipe fit runs), records from ``min_level`` up become that
    logger's one store warning instead (``owner.store_failed``)."""

    def __init__(self, min_level: int) -> None:
        super().__init__()
        self.min_level = min_level
        self.owner: Any = None  # a weak reference to the RecipeLogger of the current run

    def filter(self, record: logging.LogRecord) -> bool:
        owner = self.owner() if self.owner is not None else None
        if owner is None or record.levelno < self.min_level or not owner.keeps_journal():
            return True
        failed_run = RUN_OF_FAILED_BATCH.match(record.getMessage())
        if failed_run is not None and failed_run.group(1) != owner.journal_run_id():
            # a batch of another run (an earlier run of this process whose store failed, still draining MLflow's
            # queue) is not this run's store failing; that run's journal holds it, and its warning was given: quiet
            return False
        owner.store_failed(record.getMessage())
        return False


#: how MLflow's asynchronous queue names the run of a batch it could not write
RUN_OF_FAILED_BATCH = re.compile(r"Run Id (\w+): Failed to log run data")


#: MLflow's loggers that report a refused write, each with the filter that turns them into the one warning
STORE_FAILURE_LOGGERS = {
    "mlflow.utils.async_logging.async_logging_queue": StoreFailureFilter(logging.ERROR),
    "mlflow.store.db.utils": StoreFailureFilter(logging.ERROR),
    "mlflow.system_metrics.system_metrics_monitor": StoreFailureFilter(logging.WARNING),
}


def watch_store_failures(owner: Any) -> None:
    """Route MLflow's reports of refused writes to ``owner.store_failed`` while ``owner`` keeps a journal."""
    for name, store_filter in STORE_FAILURE_LOGGERS.items():
        store_filter.owner = weakref.ref(owner)
        mlflow_logger = logging.getLogger(name)
        if store_filter not in mlflow_logger.filters:
            mlflow_logger.addFilter(store_filter)


__all__ = [
    "BOUNDED_HTTP_SETTINGS",
    "TrackingStoreReadOnly",
    "TrackingStoreWarning",
    "bound_http_requests",
    "cut_at_word",
    "fast_http_failures",
    "is_read_only",
    "is_server_uri",
    "lost_insert_race",
    "read_only_at_start",
    "short_reason",
    "store_failure_message",
    "warn_store_failure",
    "watch_store_failures",
]
