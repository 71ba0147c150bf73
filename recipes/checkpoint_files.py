"""The import path ``recipes.checkpoint_files`` that every MLflow model logged before the move imports (its copy of ``pyfunc_model.py``).

The module now lives in ``recipes.checkpoints.files``."""

from recipes.checkpoints.files import (  # noqa: F401
    STAMP_KEY,
    FIT_KEYS,
    CheckpointError,
    load_checkpoint_weights_only,
    describe_load_error,
    check_checkpoint,
    check_state_dict_matches,
    check_checkpoint_recipe,
    run_stamp,
    read_run_stamp,
    CheckpointSummary,
    check_finite_weights,
    inspect_checkpoint,
)

__all__ = [
    "STAMP_KEY",
    "FIT_KEYS",
    "CheckpointError",
    "load_checkpoint_weights_only",
    "describe_load_error",
    "check_checkpoint",
    "check_state_dict_matches",
    "check_checkpoint_recipe",
    "run_stamp",
    "read_run_stamp",
    "CheckpointSummary",
    "check_finite_weights",
    "inspect_checkpoint",
]
