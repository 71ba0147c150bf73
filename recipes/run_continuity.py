"""One MLflow run per training, however often it is interrupted: checkpoints carry their run's id, and
``recipes fit --ckpt_path <checkpoint>`` continues that run.

* ``RunContinuity`` writes ``checkpoint["loopwise"] = {"mlflow_run_id": ..., "experiment": ...}`` into every
  checkpoint (plain strings, so ``torch.load(weights_only=True)`` reads it) and tags a continued run with the step it
  resumed at.
* ``continue_stamped_run`` points the ``RecipeLogger`` of a resuming fit at the stamped run before the logger is
  built. On a continued run, curated params whose value changed (e.g. ``max_epochs`` raised to train longer) cannot
  be logged again (MLflow refuses a changed param): the new value is kept as the tag ``loopwise.resumed.<param>``
  (``TrackedRun.log_params_once``) and the param keeps the value of the first start.
"""

from __future__ import annotations

import warnings
from typing import Any

import lightning.pytorch as pl
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback

from lightning_modules.compat import mlflow_logger_experiment_name
from recipes.checkpoint_files import STAMP_KEY
from recipes.run_lock import lock_fit_run
from recipes.tracked_run import tracked_run


class RunContinuity(Callback):
    """Stamp every checkpoint with its MLflow run; tag a continued run with the global step it resumed at."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lock_fit_run(trainer)  # one process at a time trains the run: a resume of it is refused from now on
        run = tracked_run(trainer)
        if run is None or not trainer.is_global_zero or not getattr(run.logger, "resumed", False):
            return
        run.set_tag("loopwise.resumed_at_step", trainer.global_step)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        run = tracked_run(trainer)
        if run is None or run.run_id is None:
            return
        checkpoint[STAMP_KEY] = {
            "mlflow_run_id": str(run.run_id),
            "experiment": mlflow_logger_experiment_name(run.logger),
        }
        # before the file exists, every metric logged so far is in the store: a hard kill after this save loses
        # nothing up to the checkpoint that a resume restarts from (MLflow's async queue waits up to 5 s otherwise)
        run.flush_metrics()


def continue_stamped_run(logger_config: Namespace, stamp: dict[str, str], ckpt_path: str, tracking_uri: str) -> None:
    """``fit --ckpt_path``: attach the ``RecipeLogger`` config ``logger_config`` to the MLflow run stamped in the
    checkpoint (its ``init_args.run_id``).

    Nothing happens when the checkpoint has no stamp, a run id was given explicitly, or the run is not in this
    tracking store (then a new run starts, with a warning).
    """
    if logger_config.get("init_args", Namespace()).get("run_id"):
        return
    run_id = stamp.get("mlflow_run_id")
    if not run_id:
        return
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException:
        warnings.warn(
            f"checkpoint {ckpt_path} belongs to MLflow run {run_id}, which is not in {tracking_uri}: "
            "training continues in a new run",
            stacklevel=2,
        )
        return
    logger_config["init_args.run_id"] = run_id
