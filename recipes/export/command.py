"""``recipes export``: the command line of ``ExportCLI``, with the recipes command's one-line errors."""

from __future__ import annotations

import sys

from recipes.checkpoints.run_lock import release_run_locks
from recipes.export.export_cli import ExportCLI
from recipes.run.errors import RecipeInputError


def main(args: list[str]) -> int:
    """``recipes export -c <recipe> --ckpt_path ... --export_dir DIR``: 0 when written; bad input is one
    ``recipes: error:`` line and 2."""
    if any(arg in ("-h", "--help") for arg in args):  # the parser below is predict's: say what this command is first
        print("recipes export -c <recipe> --ckpt_path best|last|run:<run id>/best|mlflow:<run id>/best|<file> "
              "--export_dir DIR\n  writes the recipe's fine-tuned Hugging Face network with save_pretrained, and its "
              "image processor or tokenizer, for transformers' from_pretrained; it reads the recipe and the checkpoint "
              "as `recipes predict` does, so the options below are predict's (--export_dir: a new or empty directory)\n")
    try:
        ExportCLI(args)
    except RecipeInputError as err:
        print(f"recipes: error: {err}", file=sys.stderr)
        return 2
    finally:
        release_run_locks()
    return 0


__all__ = ["main"]
