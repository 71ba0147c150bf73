"""What ``recipes pack`` shows while it writes, on stderr: a tqdm bar of images on a terminal (when tqdm is
installed), else one line per shard (a log file gets whole lines)."""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import Any, TextIO

from recipes.pack.errors import PROG

MB = 1_000_000


def size_text(size: int) -> str:
    """A size in bytes for people: ``412 MB``, ``3.5 MB``, ``48 kB``, ``900 bytes`` (MB: 10^6 bytes)."""
    if size >= 10 * MB:
        return f"{size / MB:,.0f} MB"
    if size >= MB:
        return f"{size / MB:.1f} MB"
    if size >= 1000:
        return f"{size / 1000:.0f} kB"
    return f"{size} bytes"


class PackProgress:
    """The images written out of ``total`` (a bar) and each shard completed (a line without the bar)."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bar: Any = None
        if find_spec("tqdm") is not None and self.stream.isatty():
            from tqdm import tqdm  # noqa: PLC0415 - optional, and only on a terminal

            self.bar = tqdm(total=total, unit="img", desc=PROG, file=self.stream, dynamic_ncols=True)

    def image(self) -> None:
        """One more image written."""
        if self.bar is not None:
            self.bar.update(1)

    def shard(self, name: str, images: int, image_bytes: int) -> None:
        """A shard is complete: ``images`` images of ``image_bytes`` bytes."""
        if self.bar is not None:
            self.bar.set_postfix_str(f"{name} done", refresh=False)
        else:
            print(f"{PROG}: {name}: {images:,} images ({size_text(image_bytes)})", file=self.stream, flush=True)

    def close(self) -> None:
        """The bar ends (its line kept)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None


__all__ = ["MB", "PackProgress", "size_text"]
