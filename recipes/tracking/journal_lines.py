"""The lines of a run's journal read back: every line a JSON object of the shape the journal writes, or skipped.

A journal is a file people can reach (a copy, an editor, a disk error, a sync tool): a line that is not UTF-8 text,
not JSON, or JSON that is not an entry (``[1, 2]``, ``"text"``, an entry whose ``values`` is not an object) is
skipped with one warning naming the file and the line number, and the rest of the journal is replayed. A line cut by
a kill is no damage: the last line of the file without its end, or an unfinished line that the next attempt's
``start`` entry follows (the journal ends a cut line before it appends), is skipped without a word.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from recipes.tracking.warning_lines import one_line_warnings

NUMBER = (int, float)


class JournalLineWarning(UserWarning):
    """A line of a run's journal that is not an entry was skipped (printed as one ``recipes: warning:`` line)."""


def entry_problem(entry: Any) -> str | None:
    """Why ``entry`` (a parsed JSON line) is not a journal entry; ``None`` when it is one."""
    if not isinstance(entry, dict):
        return f"JSON {type(entry).__name__}, not an object"
    if not isinstance(entry.get("kind"), str):
        return "no \"kind\""
    if "time" in entry and entry["time"] is not None and not isinstance(entry["time"], NUMBER):
        return "\"time\" is not a number"
    if "values" in entry and not isinstance(entry["values"], dict):
        return "\"values\" is not an object"
    if entry.get("step") is not None and not isinstance(entry["step"], int):
        return "\"step\" is not an integer"
    return None


def read_entries(path: Path) -> list[dict[str, Any]]:
    """The entries of the journal at ``path``, in order; a damaged line is skipped with one warning (see above)."""
    lines = Path(path).read_bytes().split(b"\n")
    last = len(lines) - 1  # the text after the last newline: empty, or a line a kill cut
    parsed: list[tuple[int, Any, str | None]] = []  # (line number, entry or None, the problem)
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            parsed.append((index + 1, None, "not UTF-8 text"))
            continue
        except json.JSONDecodeError:
            parsed.append((index + 1, None, "cut" if index == last else "not JSON"))
            continue
        parsed.append((index + 1, entry, entry_problem(entry)))
    entries = []
    for position, (number, entry, problem) in enumerate(parsed):
        if problem is None:
            entries.append(entry)
            continue
        following = parsed[position + 1][1] if position + 1 < len(parsed) else None
        if problem == "cut" or (problem == "not JSON" and isinstance(following, dict)
                                and following.get("kind") == "start"):
            continue  # a kill cut it (see the module docstring)
        warn_damaged_line(path, number, problem)
    return entries


def warn_damaged_line(path: Path, number: int, problem: str) -> None:
    """One warning line: which file, which line, what is wrong with it, and that the rest is replayed."""
    one_line_warnings()
    warnings.warn(
        f"line {number} of the run journal {path} is not a journal entry ({problem}): skipped, the rest of the "
        "journal is replayed; restore the line from a copy if it mattered, or delete it to silence this",
        JournalLineWarning,
        stacklevel=3,
    )


__all__ = ["JournalLineWarning", "entry_problem", "read_entries"]
