"""The study of ``recipes sweep`` and its MLflow parent run, shared by every worker that runs the same command.

The study lives in an Optuna storage (default ``sqlite:///<working dir>/optuna.db``; any database URL with
``--storage``). The worker that creates the study also creates the MLflow parent run and keeps its id in the
study's user attributes; the others wait for it, so every worker nests its trials under the one parent run. With a
SQLite storage, starting a trial (counting the study's trials, then asking for a new one) holds a file lock, so
several workers on one machine never run more than ``--n_trials`` in all; workers on several machines share a server
database, where two of them may each start one last trial at the same moment (at most one extra per worker).
"""

from __future__ import annotations

import fcntl
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import optuna
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from sqlalchemy.exc import SQLAlchemyError

from recipes.sweep.heartbeat import HEARTBEAT_S, heartbeat_storage
from recipes.sweep.sampler import TrialSeededSampler
from recipes.sweep.space import SweepFile
from recipes.sweep.workers import abandoned_trials
from recipes.tracking.database_urls import masked_url
from recipes.tracking.experiment_kind import create_experiment
from recipes.tracking.sweep_counts import trial_counts

PARENT_ATTR = "loopwise.mlflow_parent_run_id"
EXPERIMENT_ATTR = "loopwise.experiment"
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
PARENT_WAIT_S = 120.0


def default_storage(directory: str | Path = ".") -> str:
    """``sqlite:///<absolute directory>/optuna.db`` (beside ``mlflow.db``)."""
    return f"sqlite:///{(Path(directory).resolve() / 'optuna.db')}"


def sqlite_path(storage: str) -> Path | None:
    """The file of a ``sqlite:///`` storage URL, else ``None``."""
    return Path(storage[len("sqlite:///"):]) if storage.startswith("sqlite:///") else None


def shown_storage(storage: str) -> str:
    """The storage URL without a password (for logs and MLflow params): ``database_urls.masked_url``."""
    return masked_url(storage)


def make_pruner(name: str) -> optuna.pruners.BasePruner:
    """Optuna's pruner called ``name`` (median waits for 5 finished trials and 1 validation before pruning)."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=1)
    if name == "percentile":
        return optuna.pruners.PercentilePruner(25.0, n_startup_trials=5, n_warmup_steps=1)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


@contextmanager
def trial_start_lock(storage: str) -> Iterator[None]:
    """Hold a lock beside a SQLite storage while a worker decides to start a trial (nothing for other storages)."""
    path = sqlite_path(storage)
    if path is None:
        yield
        return
    with open(path.with_suffix(path.suffix + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def open_study(
    storage: str, name: str, direction: str, pruner: str, seed: int | None = None,
    heartbeat_interval: int | None = HEARTBEAT_S,
) -> tuple[optuna.Study, bool, RDBStorage]:
    """The study ``name`` in ``storage`` (created now when new: ``True`` in the result) and the storage it is on,
    with heartbeats every ``heartbeat_interval`` seconds (``recipes.sweep.heartbeat``; ``None``: none), sampling each
    trial with ``TrialSeededSampler(seed)``. An existing study must have the same direction. Workers starting
    together on a new SQLite file take turns (Optuna creates its tables on first use, and two at once collide); on a
    server database a collision is retried."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = sqlite_path(storage)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    for attempt in range(5):
        try:
            with trial_start_lock(storage):
                rdb = heartbeat_storage(storage, heartbeat_interval) if heartbeat_interval else RDBStorage(storage)
                return (*create_or_load(storage, name, direction, pruner, seed, rdb), rdb)
        except SQLAlchemyError:
            if attempt == 4:
                raise
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def create_or_load(
    storage: str, name: str, direction: str, pruner: str, seed: int | None = None, rdb: RDBStorage | None = None
) -> tuple[optuna.Study, bool]:
    """The study ``name``, created or loaded (see ``open_study``), on ``rdb`` when given (else on ``storage``)."""
    on = rdb if rdb is not None else storage
    try:
        study = optuna.create_study(storage=on, study_name=name, direction=direction, sampler=TrialSeededSampler(seed),
                                    pruner=make_pruner(pruner), load_if_exists=False)
        return study, True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=on, sampler=TrialSeededSampler(seed),
                                  pruner=make_pruner(pruner))
    existing = study.direction.name.lower()
    if existing != direction:
        raise ValueError(
            f"study {name!r} in {shown_storage(storage)} maximizes/minimizes the other way ({existing}, now "
            f"{direction}): use another --study_name"
        )
    return study, False


def create_parent_run(study: optuna.Study, tracking_uri: str, experiment: str, sweep: SweepFile, settings: dict[str, Any]) -> str:
    """Create the sweep's MLflow parent run (params, the search space) and keep its id in the study."""
    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    experiment_id = found.experiment_id if found is not None else create_experiment(client, experiment)
    run = client.create_run(experiment_id, run_name=f"sweep {study.study_name}", tags={
        "loopwise.stage": "sweep", "loopwise.sweep.study": study.study_name, "loopwise.sweep.role": "parent",
    })
    run_id = run.info.run_id
    for key, value in settings.items():
        client.log_param(run_id, f"sweep.{key}", value)
    client.log_text(run_id, json.dumps(sweep.space(), indent=1, sort_keys=True), "search_space.json")
    study.set_user_attr(PARENT_ATTR, run_id)
    study.set_user_attr(EXPERIMENT_ATTR, experiment)
    return run_id


def wait_for_parent_run(study_name: str, storage: str, timeout_s: float = PARENT_WAIT_S) -> str:
    """The parent run id another worker created with the study (waiting for it to appear)."""
    deadline = time.monotonic() + timeout_s
    while True:
        run_id = optuna.load_study(study_name=study_name, storage=storage).user_attrs.get(PARENT_ATTR)
        if run_id:
            return str(run_id)
        if time.monotonic() > deadline:
            raise ValueError(f"study {study_name!r} has no MLflow parent run after {timeout_s:.0f} s")
        time.sleep(0.5)


def counts(study: optuna.Study) -> dict[str, int]:
    """Trials of the study by state: complete, pruned, failed, running, waiting (a retry not yet taken); trials
    stopped by Ctrl+C or SIGTERM, or failed because their worker died (``recipes.sweep.workers``,
    ``recipes.sweep.heartbeat``), are counted apart (``interrupted``). ``--n_trials`` counts complete trials."""
    return trial_counts(study.get_trials(deepcopy=False), abandoned_trials(study))


def record_progress(study: optuna.Study, client: MlflowClient, parent_run_id: str) -> None:
    """The parent run's summary after a trial: trial counts, the best value and params, parameter importances.

    MLflow's batch write (one ``log_batch``; MLflow splits it past 100 tags): every worker writes the same tags on
    the one parent run, and two finishing a trial at the same moment may insert the same new tag together. MLflow's
    ``set_tag`` looks the tag up, then inserts it, and fails the loser (``UNIQUE constraint failed: tags.key,
    tags.run_uuid``); its batch write tries again and updates the tag the other worker inserted."""
    done = counts(study)
    step = done["complete"] + done["pruned"] + done["failed"]
    metrics = {f"trials_{state}": float(n) for state, n in done.items() if state not in ("running", "waiting")}
    tags: dict[str, str] = {}
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        metrics["best_value"] = float(best.value)
        tags["loopwise.sweep.best_trial"] = str(best.number)
        tags.update({f"best.{key}": str(value) for key, value in best.params.items()})
        if len(complete) >= 2:
            try:
                for key, value in optuna.importance.get_param_importances(study).items():
                    metrics[f"importance/{key}"] = float(value)
            except (ValueError, RuntimeError):  # too few distinct values to tell
                pass
    now = int(time.time() * 1000)
    client.log_batch(parent_run_id, metrics=[Metric(key, value, now, step) for key, value in metrics.items()],
                     tags=[RunTag(key, value) for key, value in tags.items()], synchronous=True)


__all__ = [
    "counts",
    "create_parent_run",
    "default_storage",
    "make_pruner",
    "open_study",
    "record_progress",
    "shown_storage",
    "sqlite_path",
    "trial_start_lock",
    "wait_for_parent_run",
]
