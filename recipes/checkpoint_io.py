"""The import path ``recipes.checkpoint_io`` that users import ``AtomicCheckpointIO`` from (named in the README before the move).

The module now lives in ``recipes.checkpoints.atomic_io``."""

from recipes.checkpoints.atomic_io import (  # noqa: F401
    AtomicCheckpointIO,
    CheckpointDiskFull,
    atomic_torch_save,
    disk_full_error,
    with_atomic_checkpoint_io,
)

__all__ = [
    "AtomicCheckpointIO",
    "CheckpointDiskFull",
    "atomic_torch_save",
    "disk_full_error",
    "with_atomic_checkpoint_io",
]
