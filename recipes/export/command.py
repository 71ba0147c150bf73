"""``recipes export``: the command line of ``ExportCLI``, with the recipes command's one-line errors."""

from __future__ import annotations

import sys

from recipes.checkpoints.run_lock import release_run_locks
from recipes.export.export_cli import ExportCLI
from recipes.run.errors import RecipeInputError


def main(args: list[str]) -> int:
    """``recipes export -c <recipe> --ckpt_path ... --export_dir DIR``: 0 when written; bad input is one
    ``recipes: error:`` line and 2."""
    try:
        ExportCLI(args)
    except RecipeInputError as err:
        print(f"recipes: error: {err}", file=sys.stderr)
        return 2
    finally:
        release_run_locks()
    return 0


__all__ = ["main"]
