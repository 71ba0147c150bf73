"""Plain text tables that fit the terminal, and the CSV and JSON forms of the same rows.

``render_table`` lays out columns of ``Column``s within a width (``terminal_width()``: ``COLUMNS`` or the terminal,
80 when unknown): a header that is wider than its values wraps at spaces; when the natural widths do not fit, the
wrapping columns (``wrap``: the run label, the data mark) wrap their text onto more lines, down to their minimum
width; when that is not enough, the columns with the highest ``drop`` priority are left out (and named, so the
caller can say so); a line that still does not fit is cut. No line is wider than the width. CSV and JSON keep every
column, the full names and ids.
"""

from __future__ import annotations

import csv
import io
import json
import shutil
import textwrap
from dataclasses import dataclass
from typing import Any

from recipes.compare.labels import short_names

GAP = "  "
INDENT = " "  # a wrapped cell's next lines
MIN_WIDTH = 40
EARLY_DROP = 4  # columns left out before any text wraps
MAX_TOKEN = 24  # a wrapping column is never narrower than its longest word, up to this


@dataclass(frozen=True)
class Column:
    """One column of a text table: the row key, its header, and how it may give way to a narrow terminal."""

    key: str
    header: str
    numeric: bool = False
    wrap: bool = False
    min_width: int = 8
    drop: int = 0  # 0: always shown; otherwise the highest is left out first
    give: int = 0  # among wrapping columns, the highest narrows first


def terminal_width() -> int:
    """The width to fit: ``COLUMNS`` or the terminal's, 80 when unknown, never below ``MIN_WIDTH``."""
    return max(MIN_WIDTH, shutil.get_terminal_size((80, 24)).columns)


def cell_text(value: Any) -> str:
    """A value as table text: floats with 4 significant digits, None as blank."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.6g}"
    return str(value)


def _wrap(text: str, width: int, indent: str = "") -> list[str]:
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True, break_on_hyphens=False) or [""]


def _widths(columns: list[Column], texts: dict[str, list[str]]) -> tuple[list[int], list[int]]:
    natural, minimal = [], []
    for column in columns:
        word = max((len(w) for w in column.header.split()), default=1)
        full = max([word, *(len(t) for t in texts[column.key])])
        natural.append(full)
        token = max((len(t) for text in texts[column.key] for t in text.split()), default=0)  # no word is cut
        least = max(word, column.min_width, min(token + len(INDENT), MAX_TOKEN))
        minimal.append(min(full, least) if column.wrap else full)
    return natural, minimal


def fit_columns(columns: list[Column], texts: dict[str, list[str]], width: int) -> tuple[list[Column], list[int],
                                                                                        list[Column]]:
    """(shown columns, their widths, left-out columns): the table at most ``width`` wide where it can be.

    In order: columns with ``drop >= EARLY_DROP`` are left out before any text wraps; then the wrapping columns
    narrow (the highest ``give`` first, then the widest) down to their minimum; then the other droppable columns
    go, highest ``drop`` first.
    """
    shown, dropped = list(columns), []

    def total(widths: list[int]) -> int:
        return sum(widths) + len(GAP) * (len(widths) - 1)

    while True:
        natural, minimal = _widths(shown, texts)
        if total(natural) <= width:
            return shown, natural, dropped
        early = [c for c in shown if c.drop >= EARLY_DROP]
        if early:
            worst = max(early, key=lambda c: c.drop)
        elif total(minimal) <= width or not any(c.drop for c in shown):
            widths = list(natural)
            while total(widths) > width:  # narrow the wrapping column that gives first (the widest of equals)
                can = [i for i, c in enumerate(shown) if c.wrap and widths[i] > minimal[i]]
                if not can:
                    break
                widths[max(can, key=lambda i: (shown[i].give, widths[i]))] -= 1
            return shown, widths, dropped
        else:
            worst = max((c for c in shown if c.drop), key=lambda c: c.drop)
        shown.remove(worst)
        dropped.append(worst)


def render_table(rows: list[dict[str, Any]], columns: list[Column], width: int) -> tuple[list[str], list[str]]:
    """The lines of the table (header, rule, rows) and the headers of the columns left out to fit ``width``."""
    texts = {c.key: [cell_text(row.get(c.key)) for row in rows] for c in columns}
    shown, widths, dropped = fit_columns(columns, texts, width)

    def lines_of(cells: list[list[str]]) -> list[str]:
        height = max(len(c) for c in cells)
        out = []
        for n in range(height):
            parts = []
            for column, w, cell in zip(shown, widths, cells):
                text = cell[n] if n < len(cell) else ""
                text = text if len(text) <= w else text[: max(w - 1, 0)] + "…"
                parts.append(text.rjust(w) if column.numeric else text.ljust(w))
            line = GAP.join(parts).rstrip()
            out.append(line if len(line) <= width else line[: width - 1] + "…")
        return out

    headers = [_wrap(c.header, w) for c, w in zip(shown, widths)]
    tallest = max(len(h) for h in headers)
    header = lines_of([[""] * (tallest - len(h)) + h for h in headers])  # headers end on the line above the rule
    rule = GAP.join("-" * w for w in widths)
    out = [*header, rule if len(rule) <= width else rule[:width]]
    for i in range(len(rows)):
        cells = [_wrap(texts[c.key][i], w, INDENT) if c.wrap else [texts[c.key][i]] for c, w in zip(shown, widths)]
        out += lines_of(cells)
    return out, [c.header for c in dropped]


def wrap_note(text: str, width: int) -> list[str]:
    """A note below or above a table, wrapped to ``width`` (continuation lines indented)."""
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def format_table(rows: list[dict[str, Any]], params: list[str], width: int | None = None) -> str:
    """Rows as a text table fitting ``width``: param columns under their short names, ids cut to 8 characters.

    For tables whose columns are simply the rows' keys (``recipes compare --sweep``).
    """
    width = width or terminal_width()
    names = short_names(params)
    shown = [{k: (v[:8] if k == "id" and isinstance(v, str) else v) for k, v in row.items()} for row in rows]
    columns = [
        Column(key, names.get(key, key), numeric=all(isinstance(r.get(key), (int, float)) or r.get(key) is None
                                                     for r in rows), min_width=len(names.get(key, key)))
        for key in rows[0]
    ]
    lines, _ = render_table(shown, columns, width)
    return "\n".join(lines) + "\n"


def format_csv(rows: list[dict[str, Any]]) -> str:
    """Rows as CSV: every key of every row is a column (blank where a row lacks it)."""
    fields = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n", restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def format_json(rows: list[dict[str, Any]]) -> str:
    """Rows as a JSON list of objects."""
    return json.dumps(rows, indent=2) + "\n"


__all__ = ["Column", "cell_text", "fit_columns", "format_csv", "format_json", "format_table", "render_table",
           "terminal_width", "wrap_note"]
