"""Paths a user gives to a data module: why one that cannot be opened cannot be (missing, a symbolic link loop)."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def unreachable_reason(path: str | Path) -> str | None:
    """Why ``path`` cannot be opened, in words, or ``None`` when it exists.

    A symbolic link that leads back to itself (directly or through other links) is named as such, with what to do;
    a missing path is "does not exist". Never raises (``Path.resolve`` raises ``RuntimeError`` on a loop).
    """
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return (
                f"{str(path)!r} is a symbolic link that leads back to itself (a link loop: "
                f"{os.strerror(errno.ELOOP)}); point it at the real file or folder"
            )
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            if os.path.islink(path):
                return f"{str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not exist"
            return f"{str(path)!r} does not exist"
        return f"{str(path)!r} cannot be opened ({err.strerror})"
    return None


__all__ = ["unreachable_reason"]
