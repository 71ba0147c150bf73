"""The shards of ``recipes pack``: Parquet files of about ``shard_bytes`` of image bytes each, in row groups.

Columns: ``image`` (the file's encoded bytes, stored uncompressed: PNG and JPEG are compressed already), ``label``
and ``path`` (strings, compressed, with statistics). Each shard is written under a hidden temporary name; ``publish``
renames them all to ``part-NNNNN.parquet`` once every shard is complete, so a killed pack leaves no ``*.parquet``
that looks complete (only temporary files, which ``discard`` or the next ``--overwrite`` removes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from recipes.pack.out_folder import SHARD_MARKER, shard_name, temporary_name

#: the shards' layout version, the value of ``SHARD_MARKER`` in their schema metadata
LAYOUT = b"1"
SCHEMA = pa.schema(
    [("image", pa.large_binary()), ("label", pa.string()), ("path", pa.string())], metadata={SHARD_MARKER: LAYOUT}
)


class ShardWriter:
    """Rows ``(image bytes, label, path)`` in the order added, cut into shards and row groups.

    A shard ends before the image that would take its image bytes past ``shard_bytes`` (a shard holds at least one
    image, however large); a row group holds ``row_group_size`` images (a shard's last one, fewer).
    ``on_shard(name, images, image bytes)`` is called as each shard is complete.
    """

    def __init__(
        self, out: Path, shard_bytes: int, row_group_size: int,
        on_shard: Callable[[str, int, int], None] | None = None,
    ) -> None:
        self.out = out
        self.shard_bytes = shard_bytes
        self.row_group_size = row_group_size
        self.on_shard = on_shard
        self.written: list[Path] = []  # the complete shards, under their temporary names
        self.writer: pq.ParquetWriter | None = None
        self.rows: list[tuple[bytes, str, str]] = []  # the row group being filled
        self.images = 0  # in the open shard
        self.image_bytes = 0  # of the open shard

    def add(self, image: bytes, label: str, path: str) -> None:
        """Append one row (a new shard first when this image would overfill the open one)."""
        if self.writer is not None and self.images and self.image_bytes + len(image) > self.shard_bytes:
            self.end_shard()
        if self.writer is None:
            self.writer = pq.ParquetWriter(
                self.out / temporary_name(len(self.written)), SCHEMA, compression={"image": "NONE",
                "label": "SNAPPY", "path": "SNAPPY"}, use_dictionary=["label"], write_statistics=["label", "path"],
            )
        self.rows.append((image, label, path))
        self.images += 1
        self.image_bytes += len(image)
        if len(self.rows) == self.row_group_size:
            self.write_row_group()

    def write_row_group(self) -> None:
        """Write the rows held as one row group of the open shard."""
        if not self.rows:
            return
        assert self.writer is not None
        images, labels, paths = zip(*self.rows)
        table = pa.table([pa.array(images, pa.large_binary()), pa.array(labels, pa.string()),
                          pa.array(paths, pa.string())], schema=SCHEMA)
        self.writer.write_table(table, row_group_size=len(self.rows))
        self.rows = []

    def end_shard(self) -> None:
        """Complete the open shard: its last row group, the footer, the bytes on disk."""
        if self.writer is None:
            return
        self.write_row_group()
        self.writer.close()
        self.writer = None
        path = self.out / temporary_name(len(self.written))
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        self.written.append(path)
        if self.on_shard is not None:
            self.on_shard(shard_name(len(self.written) - 1), self.images, self.image_bytes)
        self.images = self.image_bytes = 0

    def publish(self, replaced: list[Path]) -> list[Path]:
        """Complete the last shard and give every shard its name ``part-NNNNN.parquet``; the shards of ``replaced``
        (an earlier pack's) that no new shard took the name of are removed. The shards, in order."""
        self.end_shard()
        final = []
        for number, path in enumerate(self.written):
            target = self.out / shard_name(number)
            os.replace(path, target)
            final.append(target)
        for old in replaced:
            if old not in final:
                old.unlink(missing_ok=True)
        self.written = []
        return final

    def discard(self) -> None:
        """Remove what was written (the temporary files): the pack did not complete."""
        if self.writer is not None:
            try:
                self.writer.close()
            except (OSError, pa.ArrowException):
                pass
            self.writer = None
            self.written.append(self.out / temporary_name(len(self.written)))
        for path in self.written:
            path.unlink(missing_ok=True)
        self.written = []
        self.rows = []


__all__ = ["LAYOUT", "SCHEMA", "ShardWriter"]
