"""Checkpoint files uploaded as MLflow run artifacts in the background, the newest version of each name winning."""

from __future__ import annotations

import shutil
import tempfile
import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable


class CheckpointUploader:
    """Uploads ``<name>.ckpt`` files off the training thread, so a slow artifact store never stalls a step.

    ``submit(name, path)`` copies the file at once (a snapshot: the trainer may rewrite ``path`` before the upload
    runs) into a private staging directory and queues its upload. One worker thread uploads in submission order;
    a name submitted again before its previous version went out replaces that version, so a store slower than the
    checkpoints only ever receives the newest file of each name. ``wait()`` blocks until everything submitted is
    uploaded (the logger calls it before it ends the run). A failed upload is a warning, never a training failure;
    ``errors`` keeps the messages.

    Args:
        upload: ``upload(local_file, name)`` sends one staged file (named ``<name>.ckpt``) to the store.
    """

    def __init__(self, upload: Callable[[str, str], None]) -> None:
        self._upload = upload
        self._lock = threading.Lock()
        self._pending: dict[str, Path] = {}  # name -> staging directory holding <name>.ckpt, not yet uploaded
        self._futures: list[Future[None]] = []
        self._executor: ThreadPoolExecutor | None = None
        self.uploaded: list[str] = []  # names in the order their uploads finished
        self.errors: list[str] = []

    def submit(self, name: str, path: str | Path) -> None:
        """Snapshot ``path`` now and upload it as ``<name>.ckpt`` in the background."""
        staging = Path(tempfile.mkdtemp(prefix=f"loopwise-upload-{name}-"))
        try:
            shutil.copyfile(path, staging / f"{name}.ckpt")
        except OSError as err:
            shutil.rmtree(staging, ignore_errors=True)
            self._warn(f"could not stage {path} for upload as {name}.ckpt: {err}")
            return
        with self._lock:
            replaced = self._pending.pop(name, None)
            self._pending[name] = staging
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopwise-upload")
            self._futures.append(self._executor.submit(self._send, name))
        if replaced is not None:
            shutil.rmtree(replaced, ignore_errors=True)

    def _send(self, name: str) -> None:
        with self._lock:
            staging = self._pending.pop(name, None)
        if staging is None:  # a newer submission of this name was already sent by an earlier job
            return
        try:
            self._upload(str(staging / f"{name}.ckpt"), name)
            self.uploaded.append(name)
        except Exception as err:  # noqa: BLE001  (an unreachable store must not kill training)
            self._warn(f"could not upload {name}.ckpt: {type(err).__name__}: {err}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def wait(self) -> None:
        """Block until every submitted file is uploaded (or failed with a warning)."""
        with self._lock:
            futures, self._futures = self._futures, []
        for future in futures:
            future.result()

    def close(self) -> None:
        """``wait()``, then stop the worker thread."""
        self.wait()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _warn(self, message: str) -> None:
        self.errors.append(message)
        warnings.warn(f"CheckpointUploader: {message}", stacklevel=3)
