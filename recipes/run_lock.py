"""One process at a time resumes a run: a second ``fit --ckpt_path`` of the same run fails at once.

Two resumes of one run would write the same ``last.ckpt`` and the same MLflow run, each overwriting the other's
steps. ``hold_run_lock`` takes an exclusive, non-blocking ``flock`` on
``<checkpoints_dir>/<experiment>/.resume-locks/<run id>.lock`` (it writes its process id into the file; the run's own
folder keeps only its checkpoints) and keeps it for the life of the process; the operating system releases it
when the process ends, however it ends (kill -9 included), so a stale lock never blocks a later resume.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import IO

LOCK_FOLDER = ".resume-locks"
_held: dict[Path, IO[str]] = {}  # the open lock files of this process (closing one would release its lock)


class RunLocked(RuntimeError):
    """Another live process is resuming the same run."""


def lock_path(experiment_dir: Path, run_id: str) -> Path:
    """The lock file of run ``run_id`` under its experiment's checkpoint folder."""
    return experiment_dir / LOCK_FOLDER / f"{run_id}.lock"


def hold_run_lock(experiment_dir: Path, run_id: str) -> None:
    """Lock run ``run_id`` for this process, or raise ``RunLocked`` naming the process that holds it."""
    try:
        import fcntl  # noqa: PLC0415
    except ImportError:  # pragma: no cover - Windows: no advisory locks; resumes are not guarded there
        return
    path = lock_path(experiment_dir, run_id).resolve()
    if path in _held:  # this process resumes the run again (recipes called twice in one Python process)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held open on purpose until the process ends
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise RunLocked(
            f"run {run_id} is being resumed by {holder} right now ({path}): wait for it to end or "
            "stop it, then resume again"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()} on {socket.gethostname()}")
    handle.flush()
    _held[path] = handle


__all__ = ["RunLocked", "hold_run_lock", "lock_path"]
