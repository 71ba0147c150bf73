"""One MLflow run per training, however often it is interrupted: checkpoints carry their run's id, and
``recipes fit --ckpt_path <checkpoint>`` continues that run.

* ``RunContinuity`` writes ``checkpoint["loopwise"] = {"mlflow_run_id": ..., "experiment": ...}`` into every
  checkpoint (plain strings, so ``torch.load(weights_only=True)`` reads it) and tags a continued run with the step it
  resumed at.
* ``continue_stamped_run`` says how to point the ``RecipeLogger`` of a resuming fit at the stamped run before the
  logger is built (the changes of its config, which ``RecipesCLI.apply_to_config`` writes). On a continued run, curated params whose value changed (e.g. ``max_epochs`` raised to train longer) cannot
  be logged again (MLflow refuses a changed param): the new value is kept as the tag ``loopwise.resumed.<param>``
  (``TrackedRun.log_params_once``) and the param keeps the value of the first start.
* A resume from a checkpoint older than the run's newest one (``--ckpt_path`` of an earlier epoch's copy, or the
  run's ``best.ckpt`` when training went on after it) is a new branch of the record, not a continuation: MLflow
  cannot delete the metric points the run logged after that step, so continuing the run would either mix the two
  trajectories or drop the retrained values. The branch is a new run tagged ``loopwise.resumed_from_run`` (the old
  run) and ``loopwise.resumed_from_step`` (the checkpoint's step); ``RunContinuity`` copies the old run's metric
  history before that step into it, so the new run is the whole trajectory it trained. Every checkpoint's stamp
  carries its ``step``, and the run its newest checkpoint's step (tag ``loopwise.checkpoint_step``), to tell them
  apart.
* A run continued or branched from another experiment's checkpoint stays in that run's experiment (and so its
  checkpoint folder, ``<checkpoints_dir>/<that experiment>/<run id>/``).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.compat.internals import mlflow_logger_experiment_name
from recipes.checkpoints.files import STAMP_KEY
from recipes.checkpoints.run_lock import lock_fit_run
from recipes.tracking.recreated_runs import current_run_id
from recipes.tracking.journal import JOURNAL_NAME, read_journal
from recipes.tracking.config import ConfigChanges
from recipes.tracking.database_urls import masked_url
from recipes.tracking.tracked_run import tracked_run

RESUMED_FROM_TAG = "loopwise.resumed_from_run"
RESUMED_FROM_STEP_TAG = "loopwise.resumed_from_step"
CHECKPOINT_STEP_TAG = "loopwise.checkpoint_step"


class RunContinuity(Callback):
    """Stamp every checkpoint with its MLflow run and step; tag a continued run with the global step it resumed at;
    give a branch (a new run resumed from an older checkpoint of another run) that run's history before its step."""

    def __init__(self) -> None:
        self.tagged_step: int | None = None  # the step last written as the run's loopwise.checkpoint_step
        self.saved_step: int | None = None  # the step of the newest checkpoint saved (the file exists at the next hook)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        lock_fit_run(trainer)  # one process at a time trains the run: a resume of it is refused from now on
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


def journaled_checkpoint_step(checkpoints_dir: str | Path | None, experiment: str, run_id: str) -> str:
    """The run's last ``loopwise.checkpoint_step`` in its journal (a store that failed mid-run holds an older one),
    else ``""``."""
    if checkpoints_dir is None:
        return ""
    path = Path(checkpoints_dir) / experiment / run_id / JOURNAL_NAME
    if not path.is_file():
        return ""
    steps = [
        str(entry["values"][CHECKPOINT_STEP_TAG])
        for entry in read_journal(path)
        if entry.get("kind") == "tags" and CHECKPOINT_STEP_TAG in (entry.get("values") or {})
    ]
    return steps[-1] if steps else ""


def continue_stamped_run(
    logger_config: Namespace,
    stamp: dict[str, str],
    ckpt_path: str,
    tracking_uri: str,
    checkpoints_dir: str | Path | None = None,
) -> ConfigChanges:
    """``fit --ckpt_path``: the changes of the ``RecipeLogger`` config ``logger_config`` (keys relative to it, e.g.
    ``init_args.run_id``; ``logger_config`` itself is not changed) that attach it to the MLflow run stamped in the
    checkpoint, in that run's experiment.

    No changes when the checkpoint has no stamp, a run id was given explicitly, or the run is not in this
    tracking store (then a new run starts, with a warning). A run ``recipes sync`` recreated under a new id is found
    by its old one. A checkpoint older than the run's newest one (its tag, or the run's journal under
    ``checkpoints_dir`` when the store missed the tag's last writes) starts a new run linked to it (module
    docstring).
    """
    if logger_config.get("init_args", Namespace()).get("run_id"):
        return {}
    run_id = stamp.get("mlflow_run_id")
    if not run_id:
        return {}
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    found = current_run_id(client, run_id)
    if found is None:
        warnings.warn(
            f"checkpoint {ckpt_path} belongs to MLflow run {run_id}, which is not in {masked_url(tracking_uri)}: "
            "training continues in a new run",
            stacklevel=2,
        )
        return {}
    run = client.get_run(found)
    experiment = client.get_experiment(run.info.experiment_id)
    name = experiment.name if experiment is not None else stamp.get("experiment", "")
    changes: ConfigChanges = {}
    if experiment is not None:
        changes["init_args.experiment_name"] = experiment.name
    step = stamp.get("step", "")
    known = [run.data.tags.get(CHECKPOINT_STEP_TAG, ""), journaled_checkpoint_step(checkpoints_dir, name, run_id)]
    newest = max((int(k) for k in known if k.isdigit()), default=None)
    if step.isdigit() and newest is not None and int(step) < newest:
        tags = {**(logger_config.get("init_args.tags") or {}), RESUMED_FROM_TAG: found, RESUMED_FROM_STEP_TAG: step}
        changes["init_args.tags"] = tags
        if rank_zero_only.rank == 0:
            print(
                f"recipes: {ckpt_path} is from step {step} of run {found}, which went on to step {newest}: "
                f"training continues in a new run linked to it ({RESUMED_FROM_TAG}), whose history before step "
                f"{step} is the old run's",
                flush=True,
            )
        return changes
    changes["init_args.run_id"] = found
    return changes
