"""The one writer of the store behind the run's journal: the journal is the write-ahead log (issue 32, issue 54).

Every metric and held tag a recipe logs goes to the run's journal at once (``recipes.tracking.journal``: flushed to
the operating system as it is written, so a killed process loses nothing) and is held here, in memory. One background
thread of the logger, ``WriteBehind``, puts what is held into the store as one synchronous ``log_batch`` of
``mlflow.entities.Metric`` (each with its own step and the time the journal recorded) when the oldest value has
waited ``hold_seconds`` (5 s); the training thread makes no MLflow call for them. There is no second buffer: MLflow's
own asynchronous queue is not used for these writes (it was, behind this hold, until issue 54: two buffers in series,
up to twice the delay, and a flush of MLflow's queue that restarted its threads at every checkpoint save).

* At a checkpoint save (``checkpoint_saved``) the journal is fsynced on its worker thread (durability comes from the
  journal; the fsync guards against the machine going down). The training thread waits neither for the disk nor for
  the store. A kill leaves the store up to ``hold_seconds`` behind the checkpoint; the journal is not, and the resume,
  the end of the run or the next loopwise command that reads the store replays it (``recipes.tracking.journal.replay``,
  the one replay routine).
* The run tags that describe an uploaded checkpoint (``loopwise.best.epoch``, ...) and the newest checkpoint's step are
  held the same way (a tag set again before the write is written once, with its newest value).
* When every value must be in the store now (``flush``: the end of the run, a logged model's metric link), the held
  values are written on the calling thread, after any write the thread has in progress: writes never overtake each
  other, so an older ``loopwise.checkpoint_step`` never lands after a newer one.

Why hold at all: one ``log_batch`` to MLflow's SQLite store is about 10 ms of SQLAlchemy work holding Python's GIL,
and a recipe logs every ``log_every_n_steps`` (10 on the spiral: every 15-20 ms); written per call, the store would
take a third of the training thread's time. Held and written every 5 s, it is one write per several hundred steps
(``benchmarks/logging_overhead.py``: the loop with MLflow against no logger).
"""

from __future__ import annotations

import functools
import os
import re
import threading
from collections.abc import Callable
from typing import Any

# the characters MLflow accepts in a metric name (Lightning's MLFlowLogger drops the others the same way)
INVALID_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")
# MLflow's limit of metrics per log_batch call
BATCH_LIMIT = 1000
HOLD_SECONDS = 5.0


@functools.lru_cache(maxsize=4096)
def _clean_name(name: str) -> str:
    """``name`` without the characters MLflow refuses (a run logs the same few names again and again)."""
    return INVALID_NAME.sub("", name)


class WriteBehind:
    """Metrics and tags held in memory and written to the run by one background thread.

    Args:
        client: Returns the run's MLflow client (the logger's ``experiment``).
        run_id: Returns the run's id.
        failure: Returns the store's failure, if it failed (then nothing is written: the journal has it all).
        failed: Reports a write the store refused (the logger's ``store_failed``).
        lock: The logger's write lock: values are added and taken under it.
        hold_seconds: Write what is held every this many seconds (default ``HOLD_SECONDS``, 5).
    """

    def __init__(
        self,
        client: Callable[[], Any],
        run_id: Callable[[], str | None],
        failure: Callable[[], str | None],
        failed: Callable[[BaseException], None],
        lock: threading.RLock,
        hold_seconds: float | None = None,
    ) -> None:
        self._client, self._run_id, self._failure, self._failed, self._lock = client, run_id, failure, failed, lock
        self.hold_seconds = HOLD_SECONDS if hold_seconds is None else hold_seconds
        self.entries: list[tuple[int, dict[str, float], int]] = []  # (step, values, time in ms) not written yet
        self.tags: dict[str, str] = {}  # run tags held the same way (the newest value of each)
        self._writing = threading.Lock()  # one write at a time, in the order the values were taken
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False

    # --- the training thread (and the upload thread, for tags) ---------------------------------------------------
    def add(self, values: dict[str, Any], step: int | None, timestamp: int) -> None:
        """Hold one call's values (strings are left out, as MLflow has no string metrics). ``timestamp`` (ms since the
        epoch) is the one the run's journal recorded for them: a value written twice, from here and from a replay of
        the journal, is then one row of the store (its key includes the time), not two. Called under ``lock``."""
        numbers = {_clean_name(k): float(v) for k, v in values.items() if not isinstance(v, str)}
        if numbers:
            self.entries.append((step or 0, numbers, timestamp))
            self._start()

    def add_tags(self, values: dict[str, str]) -> None:
        """Hold run tags. Called under ``lock``."""
        if values:
            self.tags.update(values)
            self._start()

    def checkpoint_saved(self, journal: Any) -> None:
        """A checkpoint is being saved: fsync ``journal`` (a ``TrackingJournal``, or ``None``) on its worker thread;
        the training thread waits neither for the disk nor for the store here."""
        if journal is not None:
            journal.sync_to_disk(wait=False)

    # --- writing -------------------------------------------------------------------------------------------------
    def send(self) -> None:
        """Write everything held now, on the calling thread, after any write in progress. A store that failed gets
        nothing (the journal has it: a catch-up or ``recipes sync``)."""
        from mlflow.entities import Metric, RunTag

        with self._writing:
            with self._lock:
                entries, tags = self.entries, self.tags
                self.entries, self.tags = [], {}
            if not (entries or tags) or self._failure() is not None:
                return
            metrics = [Metric(key=k, value=v, timestamp=t, step=step) for step, values, t in entries
                       for k, v in values.items()]
            batches = [metrics[i:i + BATCH_LIMIT] for i in range(0, len(metrics), BATCH_LIMIT)] or [[]]
            try:
                for i, batch in enumerate(batches):
                    run_tags = [RunTag(k, v) for k, v in tags.items()] if i == 0 else []
                    self._client().log_batch(run_id=self._run_id(), metrics=batch, tags=run_tags, synchronous=True)
            except Exception as err:  # noqa: BLE001  (the store's failure: the journal keeps the values)
                self._failed(err)

    def drop(self) -> None:
        """Forget what is held (the journal has it: a catch-up writes it from there). Called under ``lock``."""
        self.entries, self.tags = [], {}

    def flush(self, journal: Any) -> None:
        """Write every value held so far now, and fsync ``journal``."""
        self.send()
        if journal is not None:
            journal.sync_to_disk()

    def close(self) -> None:
        """Stop the thread and write what is left (the end of the run; a value held later starts it again)."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self._pid == os.getpid():
            thread.join()
        self._thread, self._closed = None, False
        self.send()

    def _start(self) -> None:
        """Start the writer thread on the first held value (again in a forked child, where it does not exist)."""
        if self._closed or (self._thread is not None and self._pid == os.getpid()):
            return  # closing, or running
        self._pid, self._wake = os.getpid(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="loopwise-store-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:  # each write starts a full hold later, however slow the store: no busy loop
            self._wake.wait(self.hold_seconds)
            if not self._closed:
                self.send()


__all__ = ["BATCH_LIMIT", "HOLD_SECONDS", "INVALID_NAME", "WriteBehind"]
