"""A task's ``init_from`` in a recipe: fetched when it names a tracked run, loaded before anything runs, recorded.

``load_task_initial_weights`` runs right after the task is built, for a command that restores no checkpoint:
``mlflow:<run id>/best|last`` (a downloaded copy of that run's checkpoint) and ``run:<run id>/best|last`` (a run of
this experiment under the checkpoints folder) become a file, and the weights are loaded there, so a wrong file, key
or shape is one ``recipes: error:`` line before the data is read. The callback
``recipes.callbacks.initial_weights_record.InitialWeightsRecord`` records what was loaded in the MLflow run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_modules.fine_tuning.settings import TRACKED_REFERENCE_PREFIXES
from lightning_modules.recipe_contract import LoadsInitialWeights, fine_tuning_of
from recipes.checkpoints.locations import resolve_checkpoint


def load_task_initial_weights(
    model: Any, experiment: str, checkpoints_dir: str | Path, tracking_uri: str | None = None
) -> str | None:
    """Load the task's ``init_from`` now (fetching a tracked run's checkpoint); returns the report's summary line,
    ``None`` when the task has no ``init_from``."""
    fine_tuning = fine_tuning_of(model)
    spec = fine_tuning.initial_weights if fine_tuning is not None else None
    if spec is None or not isinstance(model, LoadsInitialWeights):
        return None
    local = None
    if spec.path.startswith(TRACKED_REFERENCE_PREFIXES):
        try:
            local = resolve_checkpoint(spec.path, experiment, checkpoints_dir, tracking_uri, option="init_from").path
        except FileNotFoundError as err:
            raise FileNotFoundError(str(err).replace("--ckpt_path", "init_from")) from None
    report = model.load_initial_weights(local)
    return report.summary() if report is not None else None


__all__ = ["load_task_initial_weights"]
