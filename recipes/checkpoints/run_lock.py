"""One process at a time trains a run: a ``fit --ckpt_path`` of a run that another process is training (its first
fit or a resume) fails at once.

Two processes on one run would write the same ``last.ckpt`` and the same MLflow run, each overwriting the other's
steps. ``hold_run_lock`` takes an exclusive, non-blocking ``flock`` on
``<checkpoints_dir>/<experiment>/.resume-locks/<run id>.lock`` (it writes its process id into the file; the run's own
folder keeps only its checkpoints). A resume takes it while its arguments are checked, before anything is built
(``RecipesCLI.lock_resumed_run``); a new fit as soon as its run exists, at train start (``lock_fit_run``), before it
writes a checkpoint a resume could start from. The command releases it when it ends (``release_run_locks``); the
operating system releases it when the process ends, however it ends (kill -9 included), so a stale lock never
blocks a later resume.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from collections.abc import Iterable
from typing import IO, Any

LOCK_FOLDER = ".resume-locks"
_held: dict[Path, IO[str]] = {}  # the open lock files of this process (closing one would release its lock)


class RunLocked(RuntimeError):
    """Another live process is training (or resuming) the same run."""


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
            f"run {run_id} is being trained by {holder} right now ({path}): wait for it to end or "
            "stop it, then resume again"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"process {os.getpid()} on {socket.gethostname()}")
    handle.flush()
    _held[path] = handle


def run_lock_holder(experiment_dir: Path, run_id: str) -> str | None:
    """Who holds run ``run_id``'s lock now (``"process <pid> on <host>"``), ``None`` when no live process does (the
    lock is tried and released at once; a lock this process holds is its own: ``None``)."""
    try:
        import fcntl  # noqa: PLC0415
    except ImportError:  # pragma: no cover - Windows: no advisory locks
        return None
    path = lock_path(experiment_dir, run_id).resolve()
    if path in _held or not path.is_file():
        return None
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return handle.read().strip() or "another process"
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    return None


def release_run_locks() -> None:
    """Release every run lock this process holds (its command has ended; the process may run another)."""
    while _held:
        _, handle = _held.popitem()
        handle.close()  # closing the file releases its flock


def lock_fit_run(trainer: Any, folders: Iterable[Path]) -> None:
    """A fit's run locked by rank 0 once it exists (a new fit: at train start; a resume holds it already), under
    each experiment folder of the run's checkpoints (``folders``: those of its ``RunCheckpoint`` s)."""
    from recipes.tracking.tracked_run import tracked_run  # noqa: PLC0415

    run = tracked_run(trainer)
    if not trainer.is_global_zero or run is None or run.run_id is None:
        return
    for folder in set(folders):
        hold_run_lock(folder, str(run.run_id))


__all__ = ["RunLocked", "hold_run_lock", "lock_fit_run", "lock_path", "release_run_locks", "run_lock_holder"]
