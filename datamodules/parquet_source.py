"""A table stored as Parquet files, read a row group at a time: the files a path names (a file, a folder or a glob,
on local disk or any filesystem pyarrow or fsspec opens), their row groups and row counts from the files' metadata,
and one row group's columns on demand. Nothing here reads a whole table."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

SUFFIXES = (".parquet", ".pq")
#: The end of a ``ParquetSource.fingerprint``: a digest of metadata, not of the bytes (the data guard computes the
#: same kind of digest to compare with a checkpoint's).
METADATA_DIGEST = ":parquet-metadata"


def has_scheme(path: str) -> bool:
    """Whether ``path`` is a URI (``s3://bucket/key``, ``gs://``, ``hf://``, ``file://``) rather than a local path."""
    return "://" in path


def filesystem_of(path: str, owner: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem a path is on and the path within it: pyarrow's own for local paths, ``s3://``, ``gs://``,
    ``hdfs://``; fsspec's for any other scheme it knows (``hf://``, ``az://``, ...). Credentials come from the
    usual environment of each (``AWS_*`` and ``~/.aws`` for S3, ``GOOGLE_APPLICATION_CREDENTIALS``, ``HF_TOKEN``);
    ``AWS_ENDPOINT_URL`` points S3 at another server (MinIO, moto, a local gateway)."""
    import os

    import pyarrow.fs as pafs

    if not has_scheme(path):
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))
    scheme = path.split("://", 1)[0].lower()
    try:
        if scheme == "s3" and os.environ.get("AWS_ENDPOINT_URL"):
            endpoint = os.environ["AWS_ENDPOINT_URL"]
            protocol, _, host = endpoint.rpartition("://")
            return (
                pafs.S3FileSystem(
                    endpoint_override=host.rstrip("/"),
                    scheme=protocol or "https",
                    region=os.environ.get("AWS_DEFAULT_REGION", os.environ.get("AWS_REGION", "us-east-1")),
                ),
                path.split("://", 1)[1],
            )
        return pafs.FileSystem.from_uri(path)
    except (ValueError, OSError) as error:  # pyarrow's ArrowInvalid is a ValueError
        if scheme in ("s3", "gs", "gcs", "hdfs", "file"):
            raise ValueError(f"{owner}: cannot open {path!r}: {error}; check the path and the credentials") from None
    try:  # any scheme fsspec knows
        import fsspec
        from pyarrow.fs import FSSpecHandler, PyFileSystem

        filesystem, inner = fsspec.core.url_to_fs(path)
    except (ImportError, ValueError, OSError) as error:
        raise ValueError(f"{owner}: cannot open {path!r}: {error}; install the fsspec package for its scheme") from None
    return PyFileSystem(FSSpecHandler(filesystem)), inner


def list_files(path: str, owner: str) -> tuple[pafs.FileSystem, list[str]]:
    """The Parquet files ``path`` names, sorted: the file itself, every ``.parquet``/``.pq`` file under a folder
    (recursively), or the files a glob (``*``, ``?``, ``[``) matches. One-line errors for none, and for a store that
    refuses the listing (credentials, a bucket that does not exist)."""
    filesystem, inner = filesystem_of(path, owner)
    try:
        return filesystem, matching_files(filesystem, inner, path, owner)
    except OSError as error:  # pyarrow's and fsspec's errors of a store: access denied, no such bucket, network
        if isinstance(error, FileNotFoundError) and str(error).startswith(owner):
            raise
        reason = " ".join(str(error).split())
        raise ValueError(f"{owner}: cannot list {path!r}: {reason}; check the path and the credentials") from None


def matching_files(filesystem: pafs.FileSystem, inner: str, path: str, owner: str) -> list[str]:
    """``list_files``' files, on ``filesystem`` (``inner`` is ``path`` within it)."""
    import fnmatch

    import pyarrow.fs as pafs

    if any(ch in inner for ch in "*?["):
        base = inner[: min(inner.index(ch) for ch in "*?[" if ch in inner)].rsplit("/", 1)[0]
        infos = filesystem.get_file_info(pafs.FileSelector(base or "/", recursive=True, allow_not_found=True))
        files = sorted(i.path for i in infos if i.type == pafs.FileType.File and fnmatch.fnmatch(i.path, inner))
        if not files:
            raise FileNotFoundError(f"{owner}: no file matches {path!r}")
        return files
    info = filesystem.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{owner}: {path!r} does not exist")
    if info.type == pafs.FileType.File:
        return [inner]
    infos = filesystem.get_file_info(pafs.FileSelector(inner, recursive=True))
    files = sorted(
        i.path for i in infos if i.type == pafs.FileType.File and i.path.lower().endswith(SUFFIXES)
        and not any(part.startswith((".", "_")) for part in i.path[len(inner):].split("/") if part)
    )
    if not files:
        raise FileNotFoundError(
            f"{owner}: the folder {path!r} holds no Parquet file (.parquet or .pq); write the table with "
            "pandas.DataFrame.to_parquet or pyarrow.parquet.write_table, or give the file itself"
        )
    return files


@dataclass
class ParquetSource:
    """The row groups of the Parquet files a path names, in file order, with their row counts (from metadata).

    Every file must have the same columns with the same types (else one error naming the first file that differs).
    A row is numbered by its position in the concatenation of the files (``group_start[g]`` is row group ``g``'s
    first row).

    Args:
        path: A ``.parquet``/``.pq`` file, a folder of them, or a glob, local or a URI (``s3://``, ``gs://``,
            ``hf://``, any scheme pyarrow or fsspec opens).
        owner: The name that starts every error message.
    """

    path: str
    owner: str = "ParquetSource"
    files: list[str] = field(init=False)
    schema: pa.Schema = field(init=False)
    group_file: np.ndarray = field(init=False)  # per row group: index into files
    group_index: np.ndarray = field(init=False)  # per row group: its number within its file
    group_rows: np.ndarray = field(init=False)
    group_start: np.ndarray = field(init=False)
    fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        import pyarrow.parquet as pq

        self.filesystem, self.files = list_files(self.path, self.owner)
        file_of, index_of, rows, digest = [], [], [], hashlib.sha256()
        self.schema = None  # type: ignore[assignment]
        for number, name in enumerate(self.files):
            try:
                metadata = pq.ParquetFile(name, filesystem=self.filesystem).metadata
            except Exception as error:  # pyarrow's ArrowInvalid, OSError: not Parquet, unreadable, no credentials
                raise ValueError(f"{self.owner}: cannot read {name!r} as Parquet: {error}") from None
            schema = metadata.schema.to_arrow_schema()
            if self.schema is None:
                self.schema = schema
            elif not schema.equals(self.schema):
                raise ValueError(
                    f"{self.owner}: {name!r} has the columns {describe(schema)} but {self.files[0]!r} has "
                    f"{describe(self.schema)}; every file of a table needs the same columns and types"
                )
            digest.update(name.encode())
            for group in range(metadata.num_row_groups):
                row_group = metadata.row_group(group)
                file_of.append(number)
                index_of.append(group)
                rows.append(row_group.num_rows)
                digest.update(group_digest(row_group).encode())
        self.group_file = np.asarray(file_of, dtype=np.int64)
        self.group_index = np.asarray(index_of, dtype=np.int64)
        self.group_rows = np.asarray(rows, dtype=np.int64)
        self.group_start = np.concatenate([[0], np.cumsum(self.group_rows)[:-1]]).astype(np.int64)
        self.fingerprint = digest.hexdigest()[:32] + METADATA_DIGEST
        if not len(self.group_rows) or int(self.group_rows.sum()) == 0:
            raise ValueError(f"{self.owner}: {self.path!r} holds no rows")

    @property
    def columns(self) -> list[str]:
        """The column names, as in the files."""
        return list(self.schema.names)

    @property
    def rows(self) -> int:
        """Rows in all files."""
        return int(self.group_rows.sum())

    @property
    def groups(self) -> int:
        """Row groups in all files."""
        return len(self.group_rows)

    def read(self, group: int, columns: list[str]) -> pa.Table:
        """Row group ``group``'s ``columns``."""
        import pyarrow.parquet as pq

        file = pq.ParquetFile(self.files[int(self.group_file[group])], filesystem=self.filesystem)
        return file.read_row_group(int(self.group_index[group]), columns=columns)

    def row_numbers(self, group: int) -> np.ndarray:
        """The row numbers (in the whole source) of row group ``group``'s rows."""
        start = int(self.group_start[group])
        return np.arange(start, start + int(self.group_rows[group]), dtype=np.int64)

    def __getstate__(self) -> dict[str, Any]:  # loader workers get a copy: pyarrow filesystems pickle
        return dict(self.__dict__)


def group_digest(row_group: Any) -> str:
    """A row group's identity from its metadata: rows, bytes and each column chunk's statistics and sizes (a
    changed value changes a min, max, null count or a compressed size almost always, without reading any data)."""
    parts: list[Any] = [row_group.num_rows, row_group.total_byte_size]
    for i in range(row_group.num_columns):
        chunk = row_group.column(i)
        stats = chunk.statistics
        parts.append(
            [
                chunk.path_in_schema,
                chunk.total_compressed_size,
                chunk.total_uncompressed_size,
                None if stats is None or not stats.has_min_max else [repr(stats.min), repr(stats.max)],
                None if stats is None else stats.null_count,
            ]
        )
    return json.dumps(parts, default=str)


def describe(schema: pa.Schema) -> str:
    """``[a: int64, b: string]``."""
    return "[" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "]"
