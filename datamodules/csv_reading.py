"""Reading CSV text with Python's ``csv`` module: fields of any length; and a CSV or text file that is not UTF-8
named by its line and byte with what to do (the tabular, text and character data modules)."""

from __future__ import annotations

import csv
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence


@contextmanager
def fields_of_any_length() -> Iterator[None]:
    """Lift ``csv``'s field size limit (131,072 characters by default, a ``_csv.Error`` beyond) while reading, and
    put the previous limit back after: a long text is read whole and cut to ``max_length`` by the tokenizer."""
    previous = csv.field_size_limit()
    limit = sys.maxsize
    while True:  # the largest value the platform's C long takes
        try:
            csv.field_size_limit(limit)
            break
        except OverflowError:
            limit //= 2
    try:
        yield
    finally:
        csv.field_size_limit(previous)


def shown_fields(names: Sequence[object], count: int = 20, width: int = 60) -> str:
    """Field or column names for a one-line message: each cut to ``width`` characters and at most ``count`` of them
    (a 40 MB header line is one "field" that must not become a 40 MB message)."""
    cut = [str(n) if len(str(n)) <= width else f"{str(n)[:width]}... ({len(str(n)):,} characters)" for n in names]
    more = f", ... ({len(cut) - count} more)" if len(cut) > count else ""
    return "[" + ", ".join(repr(n) for n in cut[:count]) + more + "]"


def not_utf8_message(path: str | Path, err: UnicodeDecodeError) -> str:
    """One line naming the file, the line and byte offset of the first byte that is not UTF-8, and the fix.

    ``err.start`` counts from the start of the decoder's chunk, not of the file, so the file is decoded again here
    to find the first bad byte's offset and line.
    """
    data = Path(path).read_bytes()
    start = 3 if data.startswith(b"\xef\xbb\xbf") else 0  # a byte-order mark is fine
    try:
        data[start:].decode("utf-8")
        offset, byte = err.start, err.object[err.start : err.start + 1]
    except UnicodeDecodeError as whole:
        offset, byte = start + whole.start, data[start + whole.start : start + whole.start + 1]
    line = data.count(b"\n", 0, offset) + 1
    return (
        f"{str(path)!r} is not UTF-8 text: line {line}, byte {offset} is 0x{byte.hex()} ({err.reason}); save the file "
        "as UTF-8 (a spreadsheet's 'CSV UTF-8'; iconv -f latin1 -t utf-8 for a Latin-1 file) and run again"
    )


__all__ = ["fields_of_any_length", "not_utf8_message", "shown_fields"]
