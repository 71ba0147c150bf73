"""The one error ``recipes pack`` reports: a line ``recipes pack: error: ...`` and exit code 2."""

from __future__ import annotations

PROG = "recipes pack"


class PackError(Exception):
    """Bad input to ``recipes pack``, reported as one error line and exit code 2 (no traceback)."""


__all__ = ["PROG", "PackError"]
