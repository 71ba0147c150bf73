"""The store written behind the run's journal: the journal is the write-ahead log (issue 32).

Every metric a recipe logs goes to the run's journal at once (``recipes.tracking.journal``) and is held in memory
(``recipes.tracking.held_metrics``). ``WriteBehind`` hands the held values to the store:

* when the oldest has waited ``hold_seconds`` (5 s), queued to MLflow's asynchronous writer;
* at a checkpoint save (``checkpoint_saved``): the journal is fsynced (durability comes from it), on the journal's
  worker thread (every entry was already flushed to the operating system as it was written, so a killed process loses
  nothing; the fsync guards against the machine going down, and the training thread need not wait 0.5-3 ms for the
  disk). The held values are not sent at the save (a queued ``log_batch`` costs the training thread about 0.3 ms of
  MLflow's entity building and validation: 1.7% of the spiral recipe's loop when it was done at every save); they go
  out when the oldest has waited ``hold_seconds``, as between saves. The training thread does not wait for the store:
  no synchronous ``log_batch`` (about 10 ms of MLflow's SQLite store) and no ``mlflow.flush_async_logging`` (which
  stops and restarts MLflow's writer threads and waits for them). A kill leaves the store up to ``hold_seconds``
  (plus MLflow's buffer time) behind the checkpoint; the journal is not, and the resume, the end of the run or the
  next loopwise command that reads the store replays it (``recipes.tracking.pending_replay``);
* the run tags that describe an uploaded checkpoint (``loopwise.best.epoch``, ...) are held the same way by the upload
  thread: one synchronous ``log_batch`` of their own per upload held the GIL for about 10 ms of SQLAlchemy work while
  the training thread waited for it (measured with an instruction-count script of issue 32, in git history);
* synchronously, when every value must be in the store now (``flush``: the end of the run, a logged model's metric
  link): MLflow's asynchronous queue first, then the held values (a tag queued earlier, such as an older
  ``loopwise.checkpoint_step``, never lands after the newer value and overwrites it).

MLflow's own asynchronous path is used rather than a writer thread of loopwise's: queuing a batch costs the training
thread a queue put and a future (tens of microseconds); the cost of MLflow's path was its flush at every save.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from recipes.tracking.held_metrics import HeldMetrics


class WriteBehind:
    """Held metrics handed to the store behind the journal.

    Args:
        held: The held metrics (the logger's ``held_metrics``).
        client: Returns the run's MLflow client (the logger's ``experiment``).
        run_id: Returns the run's id.
        failure: Returns the store's failure, if it failed (then nothing is written: the journal has it all).
        failed: Reports a write the store refused (the logger's ``store_failed``).
        lock: Taken while held values are dropped because the store failed (the logger's write lock).
    """

    def __init__(
        self,
        held: HeldMetrics,
        client: Callable[[], Any],
        run_id: Callable[[], str | None],
        failure: Callable[[], str | None],
        failed: Callable[[BaseException], None],
        lock: threading.RLock,
    ) -> None:
        self.held = held
        self._client, self._run_id, self._failure, self._failed, self._lock = client, run_id, failure, failed, lock
        self.queued = False  # a metric batch went to MLflow's asynchronous queue since the last flush

    def send(self, synchronous: bool = True) -> None:
        """Write the held values as one ``log_batch`` (``synchronous``: before returning; else queued to MLflow's
        asynchronous writer). A store that failed gets nothing (the journal has them: a catch-up or ``recipes
        sync``)."""
        if not len(self.held):
            return
        if self._failure() is not None:
            with self._lock:
                self.held.take()
            return
        if not synchronous:
            self.queued = True
        elif self.queued:  # MLflow's queue first: a batch it still holds would land after this one, its older tag
            self.queued = False  # values (loopwise.checkpoint_step 44 over 66) over the newer ones written now
            try:
                wait_for_queued_writes(self._client())
            except Exception as err:  # noqa: BLE001
                self._failed(err)
        with self._lock:  # the upload thread holds checkpoint facts too: nothing added while the batches are taken
            batches = self.held.take()
        try:
            for metrics, tags in batches:
                self._client().log_batch(run_id=self._run_id(), metrics=metrics, tags=tags, synchronous=synchronous)
        except Exception as err:  # noqa: BLE001  (the store's failure: the journal keeps the values)
            self._failed(err)

    def send_due(self, synchronous: bool) -> None:
        """After values were held: write them now when every write is ``synchronous``, else queue them to MLflow's
        asynchronous writer once the oldest has waited ``hold_seconds``."""
        if synchronous:
            self.send(synchronous=True)
        elif self.held.due():
            self.send(synchronous=False)

    def checkpoint_saved(self, journal: Any) -> None:
        """A checkpoint is being saved: fsync ``journal`` (a ``TrackingJournal``, or ``None``) on its worker thread,
        and queue the held values to MLflow's asynchronous writer if the oldest has waited ``hold_seconds``; the
        training thread waits neither for the disk nor for the store here."""
        if journal is not None:
            journal.sync_to_disk(wait=False)
        self.send_due(synchronous=False)

    def flush(self, journal: Any) -> None:
        """Write every value logged so far now: the held ones synchronously, then MLflow's asynchronous queue (when
        anything went into it since the last flush), and fsync ``journal``."""
        self.send(synchronous=True)
        if journal is not None:
            journal.sync_to_disk()
        if not self.queued or self._failure() is not None:
            return  # nothing queued since the last flush: MLflow's flush restarts its threads and waits for them
        self.queued = False
        try:
            wait_for_queued_writes(self._client())
        except Exception as err:  # noqa: BLE001
            self._failed(err)


def wait_for_queued_writes(client: Any) -> None:
    """Return once every batch queued to MLflow's asynchronous writer for ``client``'s store has been written (or has
    failed). MLflow holds a queued batch up to ``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS`` (5 s in a recipe) before it
    sends it; a replay of the journal that read the store meanwhile would write the batch's values a second time.

    The queue is that of the global tracking URI's store, which ``MLFlowLogger`` set to its own when it opened the
    run; the client shares that store object (MLflow caches one per URI), so this is the queue its writes wait in."""
    import mlflow

    if mlflow.get_tracking_uri() == client.tracking_uri:
        mlflow.flush_async_logging()


__all__ = ["WriteBehind", "wait_for_queued_writes"]
