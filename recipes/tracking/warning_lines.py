"""loopwise's own warnings printed as one line: ``recipes: warning: <message>``.

Python prints a warning as ``<file>:<line>: <Category>: <message>`` followed by the source line that raised it
(Lightning, for a file whose path contains "lightning", as ``<file>:<line>: <message>``). A warning of loopwise's
(its category defined in ``recipes``, ``lightning_modules`` or ``datamodules``, or raised from a file of those
packages: a training plan that disagrees with the loop, the doctor's findings, a data column read as categorical,
a resume that cannot restore something, a tracking store that fails) already says what happened and what to do, so
it prints as that one line. Every other warning, the user's own code's included, keeps the format it had.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from functools import cache
from typing import Any

#: the packages whose warnings are loopwise's
OWN_PACKAGES = ("recipes", "lightning_modules", "datamodules")
PREFIX = "recipes: warning: "


@cache
def own_folders() -> tuple[str, ...]:
    """The folders of ``OWN_PACKAGES`` (each ending with the path separator)."""
    folders = []
    for name in OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            folders.append(os.path.join(os.path.abspath(folder), ""))
    return tuple(folders)


def is_loopwise_warning(category: Any, filename: str) -> bool:
    """Whether a warning of ``category`` raised from ``filename`` is loopwise's own."""
    module = getattr(category, "__module__", "") or ""
    if module.split(".")[0] in OWN_PACKAGES:
        return True
    return bool(filename) and os.path.abspath(filename).startswith(own_folders())


def one_line(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
    """``warnings.formatwarning`` for a recipe command: loopwise's warnings as ``recipes: warning: <message>``, every
    other one as the formatter it replaced writes it."""
    if is_loopwise_warning(category, filename):
        return PREFIX + " ".join(str(message).split("\n")) + "\n"
    return one_line.plain(message, category, filename, lineno, line)  # type: ignore[attr-defined]


def one_line_warnings() -> None:
    """Print loopwise's warnings as one line from now on in this process (``one_line`` in front of the formatter
    installed the first time, Lightning's once ``lightning`` is imported); calling it again changes nothing."""
    if not hasattr(one_line, "plain"):
        one_line.plain = warnings.formatwarning  # type: ignore[attr-defined]
    if warnings.formatwarning is not one_line:
        warnings.formatwarning = one_line  # type: ignore[assignment]


__all__ = ["OWN_PACKAGES", "PREFIX", "is_loopwise_warning", "one_line", "one_line_warnings", "own_folders"]
