"""The one error ``recipes compare`` reports: a line ``recipes compare: error: ...`` and exit code 2."""

from __future__ import annotations

PROG = "recipes compare"


class CompareError(Exception):
    """A problem reported as one error line and exit code 2 (no traceback)."""


__all__ = ["PROG", "CompareError"]
