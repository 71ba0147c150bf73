"""Checkpoint files that are either the old version or the new one, never a truncated mix.

Lightning 2.6's ``TorchCheckpointIO`` serializes the checkpoint into memory and then writes it through an fsspec
transaction, which for local paths writes a temporary file in the *system* temp directory (``tempfile.mkstemp()``)
and moves it over the target with ``shutil.move`` on commit. When the temp directory is on another file system than
the checkpoint (a tmpfs ``/tmp``, a container volume), that move is a copy followed by a delete: a crash, a kill or
a full disk during the copy leaves a truncated ``last.ckpt``; a hard kill before the commit leaves the temp file in
``/tmp``; nothing is fsynced, so a power loss can leave an empty file behind the new name.

``AtomicCheckpointIO`` writes the new checkpoint to a hidden temporary file next to the target (same directory,
hence same file system), fsyncs it, ``os.replace``s it over the target (atomic on POSIX and Windows) and fsyncs the
directory. Any failure removes the temporary file and leaves the previous checkpoint as it was; a full disk is
a ``CheckpointDiskFull`` whose message is one line (where, how much is free and needed, what to do). Remote paths
(``s3://``, ...) go to Lightning's own implementation.
"""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.plugins.io import TorchCheckpointIO
from fsspec.implementations.local import LocalFileSystem

from recipes.compat.internals import CheckpointPath, strategy_checkpoint_io_is_set

TEMP_SUFFIX = ".tmp"
# ``.<name>.<pid>@<host>.<mkstemp's random part>.tmp``: whose temp file it is, so a later process removes it once its
# writer is gone (a kill -9 during a save leaves it); mkstemp's random part holds no dot
TEMP_FILE = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)@(?P<host>.+)\.[A-Za-z0-9_]+" + re.escape(TEMP_SUFFIX))
# a temp file of an older loopwise names no writer: removed once it is this old (no save takes an hour to write)
UNNAMED_TEMP_AGE_S = 3600
_CLEANED: set[Path] = set()  # the directories this process removed leftovers from (once each)


def remove_leftover_temp_files(directory: Path) -> list[Path]:
    """Remove the temp files that saves killed mid-write (``kill -9``, a power loss) left in ``directory``: those of a
    process of this host that no longer exists, and unnamed ones over an hour old; another host's, or a live process's,
    are left to it. A temp file is hidden and ends in ``.tmp``, so nothing reads it as a checkpoint either way. Returns
    the files removed."""
    from recipes.tracking.abandoned_runs import process_exists  # noqa: PLC0415

    removed, host, now = [], socket.gethostname(), time.time()
    try:
        candidates = [p for p in Path(directory).glob(f".*{TEMP_SUFFIX}") if p.is_file()]
    except OSError:
        return removed
    for path in candidates:
        writer = TEMP_FILE.fullmatch(path.name)
        try:
            if writer is not None:
                if writer["host"] != host or process_exists(int(writer["pid"])):
                    continue
            elif now - path.stat().st_mtime < UNNAMED_TEMP_AGE_S:
                continue
            path.unlink()
            removed.append(path)
        except OSError:
            continue
    return removed


def atomic_torch_save(obj: Any, path: str | Path) -> None:
    """``torch.save(obj, path)`` that never leaves a partial file at ``path``: temp file in the same directory,
    fsync, ``os.replace``, fsync of the directory. On any error the temp file is removed and ``path`` is untouched.
    The first save into a directory removes the temp files of saves killed there before
    (``remove_leftover_temp_files``).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.parent not in _CLEANED:
        _CLEANED.add(target.parent)
        remove_leftover_temp_files(target.parent)
    prefix = f".{target.name}.{os.getpid()}@{socket.gethostname()}."
    fd, temp_name = tempfile.mkstemp(prefix=prefix, suffix=TEMP_SUFFIX, dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp_name, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the mode a plain open would
        os.replace(temp_name, target)
    except BaseException as err:
        try:
            os.unlink(temp_name)
        except FileNotFoundError:
            pass
        if isinstance(err, (OSError, RuntimeError)):
            full = disk_full_error(err, obj, target)
            if full is not None:
                raise full from err
        raise
    _fsync_directory(target.parent)


class CheckpointDiskFull(OSError):
    """No room left on the disk (or the quota) while a checkpoint was written; the previous file is intact."""


def _serialized_size(obj: Any) -> int | None:
    """How many bytes ``torch.save(obj)`` writes, counted without keeping them; ``None`` if it cannot be counted."""

    class Counter(io.RawIOBase):
        def __init__(self) -> None:
            self.count = 0

        def writable(self) -> bool:
            return True

        def write(self, data: Any) -> int:
            size = memoryview(data).nbytes
            self.count += size
            return size

    counter = Counter()
    try:
        torch.save(obj, counter)
    except Exception:  # noqa: BLE001  (only an estimate for the message)
        return None
    return counter.count


def disk_full_error(err: BaseException, obj: Any, target: Path) -> CheckpointDiskFull | None:
    """A one-line ``CheckpointDiskFull`` when ``err`` means the disk is full: ``ENOSPC``/``EDQUOT``, or torch's
    zip writer failing (``RuntimeError``: "unexpected pos", "file write failed") with less room free than the
    checkpoint needs; ``None`` otherwise."""
    codes = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
    chained = [e for e in (err, err.__cause__, err.__context__) if isinstance(e, OSError)]
    by_errno = any(e.errno in codes for e in chained)
    torch_write = isinstance(err, RuntimeError) and ("unexpected pos" in str(err) or "write failed" in str(err))
    if not (by_errno or torch_write):
        return None
    free = shutil.disk_usage(target.parent).free
    needed = _serialized_size(obj)
    if not by_errno and (needed is None or free >= needed):
        return None  # torch failed to write for another reason: its own error says which
    need = f"; the checkpoint needs {_size(needed)}" if needed is not None else ""
    kept = (
        f"then resume with --ckpt_path last; the previous {target.name} is kept intact"
        if target.exists()
        else f"then run again (no {target.name} was written)"
    )
    return CheckpointDiskFull(
        f"the disk is full at {target.parent} ({os.strerror(errno.ENOSPC)}) while writing {target.name} "
        f"({_size(free)} free{need}): free some "
        f"space there or point --checkpoints_dir at a disk with room, {kept}"
    )


def _size(count: int) -> str:
    """``count`` bytes for a person: MB from 1 MB up, bytes below."""
    return f"{count / 1e6:,.1f} MB" if count >= 1e6 else f"{count:,} bytes"


_UMASK: int | None = None


def _umask() -> int:
    """The process umask, read once (reading it means setting it)."""
    global _UMASK  # noqa: PLW0603
    if _UMASK is None:
        _UMASK = os.umask(0o022)
        os.umask(_UMASK)
    return _UMASK


def _fsync_directory(directory: Path) -> None:
    """Persist the rename (POSIX); a no-op where directories cannot be opened (Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic: temp file in the checkpoint's directory, fsync,
    ``os.replace``. A crash while saving leaves the previous checkpoint intact and no temp file behind (a hard kill
    can leave a hidden ``.<name>.<pid>@<host>.*.tmp`` next to it, never a truncated checkpoint; the next save into
    that folder, or the next run start there, removes it).

    Recipes use it by default (``recipes.run.recipes_cli.RecipesCLI``), for every strategy; a ``CheckpointIO`` given in
    ``trainer.plugins`` or to the strategy replaces it. With a plain ``lightning.Trainer``:
    ``Trainer(plugins=[AtomicCheckpointIO()])``.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: CheckpointPath, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        local = str(path)
        if local.startswith("file://"):
            local = local[len("file://") :]
        atomic_torch_save(checkpoint, local)


def with_atomic_checkpoint_io(plugins: Any, strategy: Any) -> list[Any] | None:
    """The trainer's ``plugins`` plus ``AtomicCheckpointIO``, unless a ``CheckpointIO`` is configured already (in
    ``plugins`` or on a strategy instance): ``None`` then, and the configured one is used."""
    from lightning.fabric.plugins import CheckpointIO  # noqa: PLC0415
    from lightning.pytorch.strategies import Strategy  # noqa: PLC0415

    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, CheckpointIO) for p in plugins):
        return None
    if isinstance(strategy, Strategy) and strategy_checkpoint_io_is_set(strategy):
        return None
    return [*plugins, AtomicCheckpointIO()]


__all__ = [
    "AtomicCheckpointIO",
    "CheckpointDiskFull",
    "atomic_torch_save",
    "disk_full_error",
    "remove_leftover_temp_files",
    "with_atomic_checkpoint_io",
]
