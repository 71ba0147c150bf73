"""Checkpoint files uploaded as MLflow run artifacts in the background: the newest version of each name wins, and
each name goes out at most once per interval. ``UploadLedger`` records which version of each name reached which run,
so ``recipes sync`` redoes the uploads that a failed store missed (``upload_missing_checkpoints``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

LEDGER_NAME = "checkpoint-uploads.json"
CHECKPOINT_NAMES = ("best", "last")


@dataclass
class _Pending:
    """The version of one name waiting to go out: a snapshot already staged, or a file to snapshot when sent."""

    source: Path
    staging: Path | None = None
    identity: tuple[int, int, int] | None = None  # the source's ``file_identity`` when it was staged


_CHANGED = "the file changed while it was copied"


def file_identity(path: str | Path) -> tuple[int, int, int]:
    """What changes when a file is rewritten, in place or by rename: (inode, size, modification time in ns)."""
    stat = os.stat(path)
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


class CheckpointUploader:
    """Uploads ``<name>.ckpt`` files off the training thread, so a slow artifact store never stalls a step.

    One worker thread uploads; a name submitted again before its previous version went out replaces that version,
    so a store slower than the checkpoints only ever receives the newest file of each name.

    ``min_interval_s`` spaces the uploads of one name: a submission within that many seconds of the name's previous
    upload waits, and later submissions replace it, so a run that saves every fraction of a second sends one file
    per interval instead of one per save (each upload is file I/O plus Python on a second thread, which the
    training thread pays for in GIL hand-offs). A submission that can go out at once is copied right away (a
    snapshot: the trainer may rewrite the file before the upload runs); a deferred one records the path, and the
    worker copies the file when the interval has passed. Recipes write checkpoints atomically (write, fsync,
    rename), so that copy reads a whole file; other writers may not (Lightning's ``ModelCheckpoint`` writes to the
    system's temp directory and moves the file, which is a copy into place when the checkpoint directory is on
    another filesystem), so a copy during which the file changed is dropped and the file is copied again later
    (the trainer submits its new version when its write is done).

    ``wait()`` sends everything pending now, whatever the interval, and blocks until it is uploaded (the logger calls
    it before it ends the run, so the store always ends with the newest files). A failed upload is a warning, never
    a training failure; ``errors`` keeps the messages.

    Args:
        upload: ``upload(local_file, name)`` sends one staged file (named ``<name>.ckpt``) to the store.
        min_interval_s: Least seconds between two uploads of the same name (0: every submission goes out).
        on_uploaded: ``on_uploaded(name, identity)`` after each upload that went through (the ``file_identity`` of
            the file that was sent).
        on_failed: ``on_failed(error)`` for an upload the store refused, instead of a warning (the logger's one
            store warning).
    """

    def __init__(
        self,
        upload: Callable[[str, str], None],
        min_interval_s: float = 0.0,
        on_uploaded: Callable[[str, tuple[int, int, int]], None] | None = None,
        on_failed: Callable[[BaseException], None] | None = None,
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"CheckpointUploader: min_interval_s must be >= 0, got {min_interval_s}")
        self._upload = upload
        self._on_uploaded, self._on_failed = on_uploaded, on_failed
        self.min_interval_s = float(min_interval_s)
        self._cond = threading.Condition()
        self._pending: dict[str, _Pending] = {}  # name -> newest version not yet sent, in submission order
        self._sent_at: dict[str, float] = {}  # name -> time.monotonic() when its last upload started
        self._busy = False  # the worker is sending one version now
        self._flush = 0  # callers of wait(): send pending versions without waiting for their interval
        self._closed = False
        self._worker: threading.Thread | None = None
        self.uploaded: list[str] = []  # names in the order their uploads finished
        self.errors: list[str] = []

    def submit(self, name: str, path: str | Path) -> None:
        """Upload ``path`` as ``<name>.ckpt`` in the background: at once (snapshotted now) or, within the name's
        interval, when the interval has passed (replacing any version still waiting)."""
        with self._cond:
            due = self._due_at(name) <= time.monotonic()
        item = _Pending(Path(path))
        if due:
            item.staging, problem, item.identity = self._copy(name, item.source)
            if problem is not None and problem is not _CHANGED:
                self._warn(problem)
                return  # the file cannot be read: nothing to upload
        with self._cond:
            replaced = self._pending.pop(name, None)
            self._pending[name] = item
            if self._worker is None:  # the first submission, or the first after close()
                self._closed = False
                self._worker = threading.Thread(target=self._run, name="loopwise-upload", daemon=True)
                self._worker.start()
            # a newer version of a name already waiting keeps that name's time: the worker's wait is right as it is,
            # and waking it would only make it take Python's lock from the training thread at every save
            if due or replaced is None:
                self._cond.notify_all()
        if replaced is not None and replaced.staging is not None:
            shutil.rmtree(replaced.staging, ignore_errors=True)

    def wait(self) -> None:
        """Send every pending version now and block until all are uploaded (or failed with a warning)."""
        with self._cond:
            self._flush += 1
            self._cond.notify_all()
            try:
                while self._pending or self._busy:
                    self._cond.wait()
            finally:
                self._flush -= 1

    def close(self, wait: bool = True) -> None:
        """``wait()``, then stop the worker thread (a later ``submit`` starts a new one). ``wait=False`` (a store
        that is down) drops the pending versions instead and does not wait for the one being sent."""
        if wait:
            self.wait()
        with self._cond:
            dropped = list(self._pending.values())
            self._pending.clear()
            self._closed = True
            worker, self._worker = self._worker, None
            self._cond.notify_all()
        for item in dropped:
            if item.staging is not None:
                shutil.rmtree(item.staging, ignore_errors=True)
        if worker is not None and wait:
            worker.join()

    def _due_at(self, name: str) -> float:
        last = self._sent_at.get(name)
        return float("-inf") if last is None else last + self.min_interval_s

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed and not self._pending:
                        return
                    now = time.monotonic()
                    ready = [n for n in self._pending if self._flush or self._due_at(n) <= now]
                    if ready:
                        name = ready[0]
                        item = self._pending.pop(name)
                        self._busy = True
                        self._sent_at[name] = now
                        break
                    timeout = min(self._due_at(n) for n in self._pending) - now if self._pending else None
                    self._cond.wait(timeout)
            try:
                self._send(name, item)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _send(self, name: str, item: _Pending) -> None:
        staging = item.staging
        if staging is None:
            staging, problem, item.identity = self._copy(name, item.source)
            if problem is _CHANGED:  # written to during the copy: copy it again when the name is next due
                with self._cond:
                    self._pending.setdefault(name, item)
                    self._cond.notify_all()
                return
            if problem is not None:
                # a deferred version's file may be gone by now: a trainer that keeps one best file under changing
                # file names submits the new one, then deletes the old; with a newer version waiting that is
                # expected (the newer one goes out instead), so no warning
                with self._cond:
                    superseded = name in self._pending
                if not superseded:
                    self._warn(problem)
                return
        assert staging is not None
        try:
            self._upload(str(staging / f"{name}.ckpt"), name)
            self.uploaded.append(name)
            if self._on_uploaded is not None and item.identity is not None:
                self._on_uploaded(name, item.identity)
        except Exception as err:  # noqa: BLE001  (an unreachable store must not kill training)
            if self._on_failed is not None:
                self._on_failed(err)
            else:
                self._warn(f"could not upload {name}.ckpt: {type(err).__name__}: {err}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    @staticmethod
    def _copy(name: str, source: Path) -> tuple[Path | None, str | None, tuple[int, int, int] | None]:
        """Copy ``source`` to a private ``<staging>/<name>.ckpt``: ``(staging, None, identity)``; ``(None, _CHANGED,
        None)`` if the file changed during the copy (a trainer writing it in place: the copy may be torn); ``(None,
        message, None)`` if it cannot be read."""
        staging = Path(tempfile.mkdtemp(prefix=f"loopwise-upload-{name}-"))
        try:
            before = file_identity(source)
            shutil.copyfile(source, staging / f"{name}.ckpt")
            changed = file_identity(source) != before
        except OSError as err:
            shutil.rmtree(staging, ignore_errors=True)
            return None, f"could not stage {source} for upload as {name}.ckpt: {err}", None
        if changed:
            shutil.rmtree(staging, ignore_errors=True)
            return None, _CHANGED, None
        return staging, None, before

    def _warn(self, message: str) -> None:
        self.errors.append(message)
        warnings.warn(f"CheckpointUploader: {message}", stacklevel=3)


class UploadLedger:
    """Which version (``file_identity``) of each checkpoint name reached which run: ``<run folder>/
    checkpoint-uploads.json``, ``{"<run id>": {"best": [inode, size, mtime_ns], ...}}``, rewritten atomically. The
    file exists once a run uploads checkpoints (``expect``), so ``recipes sync`` knows to bring them up to date.

    Args:
        path: The ledger file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def read(self) -> dict[str, dict[str, list[int]]]:
        """The ledger (empty when there is none or it cannot be read)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def expect(self) -> None:
        """Create the (empty) ledger if it does not exist: this run's checkpoints are meant for the store."""
        with self._lock:
            if not self.path.exists():
                self._write({})

    def mark(self, run_id: str, name: str, identity: tuple[int, int, int]) -> None:
        """Record that ``identity`` of ``name`` reached run ``run_id``."""
        with self._lock:
            data = self.read()
            data.setdefault(run_id, {})[name] = list(identity)
            self._write(data)

    def has(self, run_id: str, name: str, identity: tuple[int, int, int]) -> bool:
        """Whether that version of ``name`` is the one run ``run_id`` holds."""
        return self.read().get(run_id, {}).get(name) == list(identity)

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.tmp")
        temp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(temp, self.path)


def upload_missing_checkpoints(folder: Path, client: Any, run_id: str, artifact_dir: str = "checkpoints") -> list[str]:
    """``recipes sync``: upload the run folder's ``best.ckpt`` / ``last.ckpt`` to run ``run_id`` where the ledger
    says the run does not hold that version (an upload that failed while the store was down). Runs without a ledger
    (checkpoints not uploaded: ``log_model: false``) are left alone. Returns the file names uploaded."""
    ledger = UploadLedger(Path(folder) / LEDGER_NAME)
    if not ledger.path.is_file():
        return []
    sent = []
    for name in CHECKPOINT_NAMES:
        path = Path(folder) / f"{name}.ckpt"
        if not path.is_file():
            continue
        identity = file_identity(path)
        if ledger.has(run_id, name, identity):
            continue
        client.log_artifact(run_id, str(path), artifact_dir)
        ledger.mark(run_id, name, identity)
        sent.append(path.name)
    return sent
