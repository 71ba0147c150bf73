"""The trial counts of a sweep whose workers are all gone, written into its parent run when a later command closes
it (``recipes.tracking.abandoned_runs``): the counts a live worker writes after each trial (``trials_complete``,
``trials_pruned``, ``trials_failed``, ``trials_interrupted``), read now from what the sweep left.

* From the Optuna study when its storage is known: the parent's param ``sweep.storage`` names a SQLite file that
  exists, or a database URL that answers (one bounded connection first) and whose password is not masked in the
  param. A RUNNING trial counts as interrupted (every worker is gone), as do the trials stopped by Ctrl+C/SIGTERM and
  those failed because their worker died (the study's user attribute ``loopwise.abandoned_trials``).
* Else from the parent's child runs: FINISHED is complete, KILLED with ``loopwise.sweep.pruned`` pruned, FAILED
  failed, any other KILLED or a RUNNING one interrupted (a trial that failed before its run existed has no run and
  is not counted).

Optuna is imported here, when a dead sweep's study is read; nothing else of ``recipes.tracking`` imports it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from recipes.tracking.database_urls import DatabaseUnavailable, check_database, is_database_url, with_installed_driver

#: the study's user attribute listing the trials failed because their worker died (``recipes.sweep.workers``)
ABANDONED_TRIALS_ATTR = "loopwise.abandoned_trials"
COUNTED = ("complete", "pruned", "failed", "interrupted")
PARENT_ROLE_TAG = "loopwise.sweep.role"


def study_counts(storage: str, study_name: str) -> dict[str, int] | None:
    """The study's trials by state (``COUNTED``), or ``None`` when it cannot be read from here (see the module)."""
    if not storage or not study_name or "***" in storage:
        return None
    if storage.startswith("sqlite:///"):
        if not Path(storage[len("sqlite:///"):]).is_file():  # Optuna would create an empty one
            return None
    elif is_database_url(storage):
        try:
            storage = with_installed_driver(storage)
            check_database(storage, "sweep storage")
        except (DatabaseUnavailable, ValueError):
            return None
    else:
        return None
    import optuna  # noqa: PLC0415

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
        trials = study.get_trials(deepcopy=False)
        abandoned = {int(n) for n in study.user_attrs.get(ABANDONED_TRIALS_ATTR, [])}
    except Exception:  # noqa: BLE001  (no such study, a storage Optuna cannot open: the child runs count instead)
        return None
    counts = trial_counts(trials, abandoned)
    counts["interrupted"] += counts.pop("running")  # still RUNNING with every worker gone
    counts.pop("waiting")  # a retry nobody took: not a trial that ran
    return counts


def trial_counts(trials: Any, abandoned: set[int]) -> dict[str, int]:
    """Optuna trials by state: complete, pruned, failed, interrupted, running, waiting. A trial stopped by Ctrl+C or
    SIGTERM (user attribute ``interrupted``) or failed because its worker died (its number in ``abandoned``) is
    interrupted, not failed: it does not use the ``--n_trials`` budget. The one count of a sweep's trials, for its workers
    (``recipes.sweep.study.counts``) and for a later command closing a dead sweep (``study_counts``)."""
    counts = dict.fromkeys((*COUNTED, "running", "waiting"), 0)
    for trial in trials:
        state = trial.state.name  # optuna.trial.TrialState
        if trial.user_attrs.get("interrupted") or (state == "FAIL" and trial.number in abandoned):
            counts["interrupted"] += 1
        elif state in ("COMPLETE", "PRUNED", "FAIL"):
            counts[{"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}[state]] += 1
        elif state == "WAITING":  # a retry of a trial whose worker died, for the next worker's ask
            counts["waiting"] += 1
        else:  # RUNNING
            counts["running"] += 1
    return counts


def child_run_counts(client: Any, parent: Any) -> dict[str, int]:
    """The trials of the sweep ``parent`` (a run) by the status of their runs (see the module)."""
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'", max_results=50000)
    counts = dict.fromkeys(COUNTED, 0)
    for run in children:
        status = run.info.status
        if status == "FINISHED":
            counts["complete"] += 1
        elif status == "KILLED" and "loopwise.sweep.pruned" in run.data.tags:
            counts["pruned"] += 1
        elif status == "FAILED":
            counts["failed"] += 1
        else:
            counts["interrupted"] += 1
    return counts


def record_final_counts(client: Any, parent: Any) -> str:
    """Write the dead sweep ``parent``'s counts into it (``trials_*`` metrics, at the step a worker writes them:
    complete + pruned + failed); what was written, in words (``"3 complete, 1 interrupted (the study's)"``)."""
    from mlflow.entities import Metric  # noqa: PLC0415

    counts = study_counts(parent.data.params.get("sweep.storage", ""), parent.data.tags.get("loopwise.sweep.study", ""))
    source = "the study's"
    if counts is None:
        counts, source = child_run_counts(client, parent), "its trials' runs"
    step = counts["complete"] + counts["pruned"] + counts["failed"]
    now = int(time.time() * 1000)
    client.log_batch(parent.info.run_id, metrics=[Metric(f"trials_{key}", float(n), now, step) for key, n in counts.items()],
                     synchronous=True)
    shown = ", ".join(f"{n} {key}" for key, n in counts.items() if n) or "no trials"
    return f"{shown} ({source})"


def is_sweep_parent(run: Any) -> bool:
    """Whether ``run`` is a sweep's parent run."""
    return run.data.tags.get(PARENT_ROLE_TAG) == "parent" or run.data.tags.get("loopwise.stage") == "sweep"


__all__ = [
    "ABANDONED_TRIALS_ATTR",
    "child_run_counts",
    "is_sweep_parent",
    "record_final_counts",
    "study_counts",
    "trial_counts",
]
