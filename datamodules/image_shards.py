"""Image shards: Parquet files of encoded image files (``recipes pack``'s output), read as an image folder's samples.

A shard has one row per image: ``image`` (binary: the image file's bytes as they are, not decoded), ``label``
(string: its class folder's name) and ``path`` (string: its path relative to the image folder, ``/``-separated).
``ImageFolderDataModule`` reads a Parquet file or a folder of them instead of an image folder: the classes are the
sorted distinct labels and the samples are the rows ordered by (label, path), the order in which the folder's own
discovery lists them (classes sorted, files sorted by path within a class), so the seeded split, the statistics and
the predictions are the folder's. Only the needed columns are read (pyarrow, imported when a shard is read: an
image folder's module never imports it); images are never decoded here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datamodules.image_files import EncodedImage, find_class_names

SHARD_SUFFIXES = (".parquet", ".pq")
#: the columns of an image shard and what each must hold
SHARD_COLUMNS = {"image": "binary", "label": "string", "path": "string"}


def is_shard_file(name: str) -> bool:
    """A visible file name with a Parquet suffix (.parquet, .pq in any case)."""
    return not name.startswith(".") and name.lower().endswith(SHARD_SUFFIXES)


def shard_files_in(folder: str | os.PathLike) -> list[Path]:
    """The visible Parquet files directly in ``folder``, sorted by name (``part-00000.parquet``, ...)."""
    with os.scandir(folder) as entries:
        return sorted(Path(folder) / e.name for e in entries if e.is_file() and is_shard_file(e.name))


def is_image_shards(root: str | os.PathLike) -> bool:
    """Whether ``root`` names image shards rather than an image folder: a path ending in .parquet/.pq, or a folder
    that holds Parquet files and no class sub-folders (visible sub-folders)."""
    if os.path.basename(os.path.normpath(root)).lower().endswith(SHARD_SUFFIXES) and not os.path.isdir(root):
        return True
    return os.path.isdir(root) and not find_class_names(root) and bool(shard_files_in(root))


def shard_files(root: str | os.PathLike) -> list[Path]:
    """The shard files of ``root`` (one Parquet file, or the folder's, sorted); ``FileNotFoundError`` when missing."""
    if not os.path.exists(root):
        raise FileNotFoundError(f"root file {str(root)!r} does not exist")
    return shard_files_in(root) if os.path.isdir(root) else [Path(root)]


def kind_of(data_type: Any) -> str | None:
    """``binary`` or ``string`` for the Arrow types a shard column may have (dictionary-encoded ones too)."""
    import pyarrow as pa  # noqa: PLC0415 - only where shards are read

    if pa.types.is_dictionary(data_type):
        data_type = data_type.value_type
    if pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type):
        return "binary"
    if pa.types.is_string(data_type) or pa.types.is_large_string(data_type):
        return "string"
    return None


def check_shard(path: Path, columns: tuple[str, ...] = tuple(SHARD_COLUMNS)) -> None:
    """Fail with one line naming ``path`` when it is not a Parquet file or lacks one of the ``columns`` of an image
    shard (all three by default), or holds it with the wrong type (metadata only: no row is read)."""
    import pyarrow as pa  # noqa: PLC0415 - only where shards are read
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"{path} is not a readable Parquet file ({type(err).__name__}: {err})") from None
    missing = [c for c in columns if c not in schema.names]
    if missing:
        raise ValueError(
            f"{path} is not an image shard: it lacks the column(s) {', '.join(missing)} (an image shard, as `recipes "
            f"pack` writes, has image (binary), label (string) and path (string); it has {', '.join(schema.names)})"
        )
    wrong = [f"{c} is {schema.field(c).type}, not {SHARD_COLUMNS[c]}" for c in columns
             if kind_of(schema.field(c).type) != SHARD_COLUMNS[c]]
    if wrong:
        raise ValueError(f"{path} is not an image shard: {'; '.join(wrong)}")


def read_columns(path: Path, columns: tuple[str, ...]) -> dict[str, list]:
    """The ``columns`` of the shard ``path`` as Python lists (the file checked first to be an image shard: all three
    columns, of their types); a null cell is an error naming the row."""
    import pyarrow as pa  # noqa: PLC0415 - only where shards are read
    import pyarrow.parquet as pq  # noqa: PLC0415

    check_shard(path)
    try:
        table = pq.read_table(path, columns=list(columns))
    except (OSError, pa.ArrowException) as err:
        raise ValueError(f"cannot read the image shard {path} ({type(err).__name__}: {err})") from None
    values = {c: table.column(c).to_pylist() for c in columns}
    for column, cells in values.items():
        if None in cells:
            raise ValueError(f"{path}: row {cells.index(None)} has no {column}")
    return values


def shard_labels(files: list[Path]) -> list[str]:
    """The sorted distinct labels of the shards ``files`` (their class names); reads the ``label`` column only."""
    labels: set[str] = set()
    for path in files:
        labels.update(read_columns(path, ("label",))["label"])
    return sorted(labels)


@dataclass
class ShardRows:
    """The rows of image shards in sample order (by label, then path): their paths, labels and encoded images."""

    paths: list[str]
    labels: list[str]
    images: list[EncodedImage]


def read_shards(files: list[Path]) -> ShardRows:
    """Every row of the shards ``files``, ordered by (label, path) as an image folder lists its files; each image an
    ``EncodedImage`` named ``<path> (in <shard file>)``. A path found twice is an error naming both shards."""
    rows: list[tuple[str, str, EncodedImage]] = []
    seen: dict[str, Path] = {}
    for shard in files:
        columns = read_columns(shard, ("label", "path", "image"))
        for label, path, image in zip(columns["label"], columns["path"], columns["image"]):
            if path in seen:
                raise ValueError(f"the image {path!r} is in the shards twice ({seen[path]} and {shard})")
            seen[path] = shard
            rows.append((label, path, EncodedImage(image, f"{path} (in {shard})")))
        del columns
    rows.sort(key=lambda row: (row[0], row[1]))
    return ShardRows([r[1] for r in rows], [r[0] for r in rows], [r[2] for r in rows])


__all__ = [
    "SHARD_COLUMNS", "SHARD_SUFFIXES", "ShardRows", "check_shard", "is_image_shards", "is_shard_file", "read_shards",
    "shard_files", "shard_labels",
]
