"""The import path ``recipes.loader_resume`` that users import callbacks from (named in the README before the move).

The module now lives in ``recipes.callbacks.loader_resume``."""

from recipes.callbacks.loader_resume import (  # noqa: F401
    LoaderPositionOnResume,
    stateful_train_loaders,
)

__all__ = [
    "LoaderPositionOnResume",
    "stateful_train_loaders",
]
