"""What a recipe command counts as bad input: ``RecipeInputError`` (one ``recipes: error:`` line, exit 2) and the
exceptions that become one before the loop starts."""

from __future__ import annotations

from lightning.pytorch.utilities.exceptions import MisconfigurationException

INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, MisconfigurationException)  # CheckpointError is a ValueError


class RecipeInputError(Exception):
    """A config, data or checkpoint problem found before the training loop started."""


def concise_error(err: BaseException) -> str:
    """One readable message: jsonargparse's Union report cut down to the errors that are not 'not None'."""
    text = str(err)
    if "Does not validate against any of the Union subtypes" in text:
        reasons = [
            line.strip()[2:]
            for line in text.splitlines()
            if line.strip().startswith("- ") and "NoneType" not in line
        ]
        if reasons:
            return "; ".join(reasons)
    return f"{type(err).__name__}: {text}"
