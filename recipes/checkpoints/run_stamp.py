"""One MLflow run per training, however often it is interrupted: checkpoints carry their run's id, and
``recipes fit --ckpt_path <checkpoint>`` continues that run.

* ``RunContinuity`` (``recipes.callbacks.run_continuity``) writes
  ``checkpoint["loopwise"] = {"mlflow_run_id": ..., "experiment": ...}`` into every checkpoint (plain strings, so
  ``torch.load(weights_only=True)`` reads it) and tags a continued run with the step it resumed at.
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

from jsonargparse import Namespace
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.tracking.recreated_runs import current_run_id
from recipes.tracking.journal import JOURNAL_NAME, read_journal
from recipes.tracking.config import ConfigChanges
from recipes.tracking.database_urls import masked_url

RESUMED_FROM_TAG = "loopwise.resumed_from_run"
RESUMED_FROM_STEP_TAG = "loopwise.resumed_from_step"
CHECKPOINT_STEP_TAG = "loopwise.checkpoint_step"


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
    new_run: bool = False,
) -> ConfigChanges:
    """``fit --ckpt_path``: the changes of the ``RecipeLogger`` config ``logger_config`` (keys relative to it, e.g.
    ``init_args.run_id``; ``logger_config`` itself is not changed) that attach it to the MLflow run stamped in the
    checkpoint, in that run's experiment.

    No changes when the checkpoint has no stamp, a run id was given explicitly, or the run is not in this
    tracking store (then a new run starts, with a warning). A run ``recipes sync`` recreated under a new id is found
    by its old one. A checkpoint older than the run's newest one (its tag, or the run's journal under
    ``checkpoints_dir`` when the store missed the tag's last writes) starts a new run linked to it (module
    docstring); so does any checkpoint when ``new_run`` (a sweep's retry of a killed trial: the retry is a trial, and
    a run, of its own).
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
    older = step.isdigit() and newest is not None and int(step) < newest
    if older or new_run:  # a stamp without a step (an older checkpoint) links the run, with no history to copy
        tags = {**(logger_config.get("init_args.tags") or {}), RESUMED_FROM_TAG: found,
                **({RESUMED_FROM_STEP_TAG: step} if step.isdigit() else {})}
        changes["init_args.tags"] = tags
        if rank_zero_only.rank == 0:
            where = f", which went on to step {newest}" if older else ""
            print(
                f"recipes: {ckpt_path} is from step {step} of run {found}{where}: training continues in a new run "
                f"linked to it ({RESUMED_FROM_TAG}), whose history before step {step} is the old run's",
                flush=True,
            )
        return changes
    changes["init_args.run_id"] = found
    return changes
