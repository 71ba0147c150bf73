"""``RunContinuity``: every checkpoint stamped with its MLflow run and step, a continued run tagged with the step it
resumed at, a branch given the old run's history before its step (why: ``recipes.checkpoints.run_stamp``)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from recipes.compat.internals import mlflow_logger_experiment_name
from recipes.checkpoints.files import STAMP_KEY
from recipes.callbacks.run_checkpoint import RunCheckpoint
from recipes.checkpoints.run_lock import lock_fit_run
from recipes.checkpoints.run_stamp import CHECKPOINT_STEP_TAG, RESUMED_FROM_STEP_TAG, RESUMED_FROM_TAG
from recipes.tracking.tracked_run import tracked_run


class RunContinuity(Callback):
    """Stamp every checkpoint with its MLflow run and step; tag a continued run with the global step it resumed at;
    give a branch (a new run resumed from an older checkpoint of another run) that run's history before its step."""

    def __init__(self) -> None:
        self.tagged_step: int | None = None  # the step last written as the run's loopwise.checkpoint_step
        self.saved_step: int | None = None  # the step of the newest checkpoint saved (the file exists at the next hook)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        folders = [c.root / c.experiment for c in trainer.checkpoint_callbacks if isinstance(c, RunCheckpoint)]
        lock_fit_run(trainer, folders)  # one process at a time trains the run: a resume of it is refused from now on
        run = tracked_run(trainer)
        if run is None or not trainer.is_global_zero:
            return
        tags = getattr(run.logger, "tags", None) or {}
        if tags.get(RESUMED_FROM_TAG) and tags.get(RESUMED_FROM_STEP_TAG, "").isdigit():
            copy_history(run, tags[RESUMED_FROM_TAG], int(tags[RESUMED_FROM_STEP_TAG]))
        if getattr(run.logger, "resumed", False):
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
            "step": str(trainer.global_step),
        }
        self.saved_step = trainer.global_step
        dumped = getattr(run.logger, "checkpoint_dumped", None)
        if callable(dumped):  # its facts are tagged on the run when the file is uploaded (RecipeLogger)
            dumped(checkpoint)
        # before the file exists, every metric logged so far is in the fsynced journal (the write-ahead log) and on
        # its way to the store: a hard kill after this save loses nothing up to the checkpoint that a replay (the
        # resume, the next command that reads the store) does not restore
        run.checkpoint_saved()

    def tag_checkpoint_step(self, trainer: pl.Trainer) -> None:
        """Write the step of the newest checkpoint as the run's tag, once its file exists (this runs at the hooks
        after a save: a kill during the file's write leaves the tag behind the file, never ahead of it, so a resume
        from the newest file is never taken for an older one). Best and last saved at one step: one write."""
        if self.saved_step is None or self.saved_step == self.tagged_step or not trainer.is_global_zero:
            return
        run = tracked_run(trainer)
        if run is not None:
            self.tagged_step = self.saved_step
            run.set_tag(CHECKPOINT_STEP_TAG, self.saved_step, synchronous=False)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.tag_checkpoint_step(trainer)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tag_checkpoint_step(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.tag_checkpoint_step(trainer)


def copy_history(run: Any, source_run_id: str, before_step: int) -> None:
    """Log into ``run`` (a ``TrackedRun``) every metric value that run ``source_run_id`` logged before
    ``before_step``, at its step, through the run's logger (so its journal holds them too)."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(run.tracking_uri)
    by_step: dict[int, dict[str, float]] = {}
    for key in client.get_run(source_run_id).data.metrics:
        for metric in client.get_metric_history(source_run_id, key):
            if metric.step < before_step:
                by_step.setdefault(metric.step, {})[key] = metric.value
    run.logger.log_history(by_step)


__all__ = ["RunContinuity", "copy_history"]
