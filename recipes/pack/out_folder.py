"""The folder ``recipes pack`` writes: which of its entries are shards it wrote, what blocks a pack, the names.

A shard is ``part-NNNNN.parquet`` whose Parquet schema carries ``SHARD_MARKER``; while it is written it is the hidden
``.part-NNNNN.parquet.<pid>.partial`` (no ``*.parquet`` name: nothing reads it as a shard). ``--overwrite`` replaces
the shards and removes the temporary files of an earlier pack, nothing else.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from datamodules.image_shards import is_shard_file
from recipes.pack.errors import PackError

#: the key of the Parquet schema metadata that marks a shard ``recipes pack`` wrote (its value: the layout version)
SHARD_MARKER = b"loopwise.image_shard"
SHARD_NAME = re.compile(r"part-\d{5,}\.parquet")
TEMPORARY_NAME = re.compile(r"\.part-\d{5,}\.parquet\.\d+\.partial")


def shard_name(number: int) -> str:
    """The name of shard ``number``: ``part-00000.parquet``, ..."""
    return f"part-{number:05d}.parquet"


def temporary_name(number: int) -> str:
    """The hidden name shard ``number`` has while it is written (this process's id in it)."""
    return f".{shard_name(number)}.{os.getpid()}.partial"


def written_by_pack(path: Path) -> bool:
    """Whether ``path`` is a shard ``recipes pack`` wrote: its name and the marker in its schema."""
    if not SHARD_NAME.fullmatch(path.name) or not path.is_file():
        return False
    try:
        metadata = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowException):
        return False
    return SHARD_MARKER in metadata


def inside(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it (real paths)."""
    real, top = os.path.realpath(path), os.path.realpath(folder)
    return real == top or real.startswith(os.path.join(top, ""))


def prepare_out(out: str, image_root: str, overwrite: bool) -> tuple[Path, list[Path], bool]:
    """Check ``out`` and make it ready: ``(folder, the earlier shards that this pack replaces, created)``.

    A ``PackError`` line for an ``out`` that is a file, lies inside the image folder (it would be read as a class
    folder), or is not empty without ``overwrite``; with it, for an ``out`` holding a sub-folder or a Parquet file
    ``recipes pack`` did not write (the data module would read the folder as an image folder, or that file as a
    shard). The temporary files of an earlier, killed pack are removed (with ``overwrite``)."""
    folder = Path(os.path.expanduser(out))
    if folder.exists() and not folder.is_dir():
        raise PackError(f"out {out!r} is a file; name a new or empty folder for the shards")
    if inside(str(folder), image_root):
        raise PackError(f"out {out!r} is inside the image folder (the shards would be read as a class folder); "
                        "name a folder outside it")
    if inside(image_root, str(folder)):
        raise PackError(f"out {out!r} holds the image folder; name a folder of its own for the shards")
    if not folder.exists():
        try:
            folder.mkdir(parents=True)
        except OSError as err:
            raise PackError(f"cannot create out {out!r}: {err.strerror or err}") from None
        return folder, [], True
    entries = sorted(folder.iterdir())
    if not entries:
        return folder, [], False
    if not overwrite:
        raise PackError(f"out {out!r} is not empty ({len(entries)} entr{'y' if len(entries) == 1 else 'ies'}); "
                        "--overwrite replaces the shards recipes pack wrote there (and deletes nothing else)")
    ours, stale = [], []
    for entry in entries:
        if TEMPORARY_NAME.fullmatch(entry.name) and entry.is_file():
            stale.append(entry)
        elif written_by_pack(entry):
            ours.append(entry)
        elif entry.is_dir() and not entry.name.startswith("."):
            raise PackError(f"out {out!r} holds the folder {entry.name!r}: ImageFolderDataModule would read out as "
                            "an image folder, not as shards; move it away or name another out")
        elif is_shard_file(entry.name) and entry.is_file():
            raise PackError(f"out {out!r} holds {entry.name}, a Parquet file recipes pack did not write: it would be "
                            "read as a shard; move it away or name another out")
    for entry in stale:
        entry.unlink()
    return folder, ours, False


__all__ = ["SHARD_MARKER", "prepare_out", "shard_name", "temporary_name", "written_by_pack"]
