"""Heartbeats of a sweep's trials, so that a trial whose worker died on any machine is failed and retried.

Optuna's RDB storages (SQLite, PostgreSQL, MySQL) keep a heartbeat per running trial when they are built with a
``heartbeat_interval``; ``optuna.storages.fail_stale_trials`` fails the RUNNING trials whose last heartbeat is older
than the ``grace_period`` and hands each to the storage's ``heartbeat_stale_trial_callback``. Optuna beats for a
trial only inside ``Study.optimize``; ``recipes sweep`` asks and tells (``recipes.sweep.runner``), so it records
the heartbeats itself through the storage's public API (``record_heartbeat``), from a thread of the worker, while
the trial trains (``beating``).

A stale trial (and a trial of a dead process of this host, ``recipes.sweep.workers``) is retried by Optuna's
``RetryHeartbeatStaleTrialCallback``: a new WAITING trial with the same values, which the next ``ask`` of any worker
takes first; ``retried_trial`` names the first trial of the chain it repeats, ``retry_chain`` the whole chain, whose
last trial's MLflow run and last checkpoint the retry trains on from (``recipes.sweep.runner.retry_link``).
"""

from __future__ import annotations

import copy
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from recipes.tracking.abandoned_runs import HOST_TAG, PID_TAG

#: seconds between two heartbeats of a running trial (``recipes sweep --heartbeat_interval``)
HEARTBEAT_S = 10
#: a trial without a heartbeat for this many intervals is stale (its worker is taken for dead)
GRACE_INTERVALS = 3


@contextmanager
def stable_enough() -> Iterator[None]:
    """Without Optuna's warning, at every call, that its heartbeat parts are experimental (they are since 2.8-2.9)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


#: a trial's values run at most this many more times after its first worker died (a trial whose values get every
#: worker killed, by the out-of-memory killer say, is not retried forever)
MAX_RETRY = 2
#: user attributes of a failed trial that its retry must not inherit: whose it was and how it ended
NOT_INHERITED = ("interrupted", "failure", HOST_TAG, PID_TAG)


class RetryStaleTrial(RetryHeartbeatStaleTrialCallback):
    """Optuna's retry of a trial failed for its missing heartbeats (``fail_stale_trials`` calls it for each trial it
    failed itself), which also keeps the numbers of those trials for the caller, and gives the retry none of the
    dead trial's own attributes (``NOT_INHERITED``)."""

    def __init__(self) -> None:
        super().__init__(max_retry=MAX_RETRY)
        self.failed: list[int] = []

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.failed.append(trial.number)
        super().__call__(study, inheritable(trial))


def inheritable(trial: FrozenTrial) -> FrozenTrial:
    """``trial`` with only the user attributes a retry of it may carry."""
    kept = copy.deepcopy(trial)
    kept.user_attrs = {key: value for key, value in trial.user_attrs.items() if key not in NOT_INHERITED}
    return kept


def heartbeat_storage(url: str, interval: int = HEARTBEAT_S) -> RDBStorage:
    """Optuna's storage at ``url`` with heartbeats every ``interval`` seconds, stale after ``GRACE_INTERVALS`` of
    them, and a stale trial retried (``RetryStaleTrial``)."""
    with stable_enough():
        return RDBStorage(url, heartbeat_interval=interval, grace_period=GRACE_INTERVALS * interval,
                          heartbeat_stale_trial_callback=RetryStaleTrial())


def retry(study: optuna.Study, trial: FrozenTrial, max_retry: int | None = MAX_RETRY) -> None:
    """Queue ``trial`` (failed because its worker died or was preempted) again: a WAITING trial with its values
    (Optuna's callback), at most ``max_retry`` times per trial (``None``: always; a preemption is the scheduler's
    doing, not the values', and its retry trains on from where it stopped)."""
    with stable_enough():
        RetryHeartbeatStaleTrialCallback(max_retry=max_retry)(study, inheritable(trial))


def frozen_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """Trial ``number`` of ``study`` as stored now."""
    return next(t for t in study.get_trials(deepcopy=False) if t.number == number)


def retried_trial(study: optuna.Study, number: int) -> int | None:
    """The number of the trial that trial ``number`` retries (the first of the chain), ``None`` for a new one."""
    with stable_enough():
        return RetryHeartbeatStaleTrialCallback.retried_trial_number(frozen_trial(study, number))


def retry_chain(study: optuna.Study, number: int) -> list[int]:
    """The trials that trial ``number`` repeats, first to last (Optuna's ``retry_history``: the last is the one right
    before it, whose run and checkpoint it trains on from); empty for a new trial."""
    with stable_enough():
        return list(RetryHeartbeatStaleTrialCallback.retry_history(frozen_trial(study, number)))


def queued_again(study: optuna.Study, numbers: list[int]) -> str:
    """How the failed trials ``numbers`` went on, for the line that names them: "queued again with the same values",
    naming those that were not (``MAX_RETRY`` retries of their values had been made already)."""
    with stable_enough():
        histories = [RetryHeartbeatStaleTrialCallback.retry_history(t) for t in study.get_trials(deepcopy=False)]
    repeated = {history[-1] for history in histories if history}
    dropped = [n for n in numbers if n not in repeated]
    if not dropped:
        return "queued again with the same values"
    shown = ", ".join(map(str, dropped))
    why = f"already ran {MAX_RETRY + 1} times or more, each run stopped with its worker"
    if len(dropped) == len(numbers):
        return f"not queued again (their values {why})"
    return f"queued again with the same values, except {shown} (whose values {why})"


def fail_stale_trials(study: optuna.Study, storage: RDBStorage) -> list[int]:
    """Fail (and retry) the RUNNING trials whose worker stopped beating; the numbers of those this call failed (not
    a trial another worker failed or told meanwhile). Nothing without heartbeats."""
    callback = storage.get_heartbeat_stale_trial_callback()
    if storage.get_heartbeat_interval() is None or not isinstance(callback, RetryStaleTrial):
        return []
    callback.failed = []
    with stable_enough():
        optuna.storages.fail_stale_trials(study)
    return sorted(callback.failed)


def first_beat(study: optuna.Study, storage: RDBStorage, number: int) -> int | None:
    """Record trial ``number``'s first heartbeat now (right after ``ask``: a RUNNING trial without one is never
    taken for stale); the storage's id of the trial, for ``beating``. Nothing without heartbeats (``None``)."""
    if storage.get_heartbeat_interval() is None:
        return None
    trial_id = trial_id_of(study, storage, number)
    storage.record_heartbeat(trial_id)
    return trial_id


def trial_id_of(study: optuna.Study, storage: RDBStorage, number: int) -> int:
    """The storage's id of trial ``number`` (public API: study id by name, then trial id by number)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def ask(study: optuna.Study) -> optuna.Trial:
    """``study.ask()`` (a WAITING retry first) without Optuna's warning that heartbeats are meant for ``optimize``:
    this module records them itself."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        return study.ask()


@contextmanager
def beating(storage: RDBStorage, trial_id: int, number: int) -> Iterator[None]:
    """Record the heartbeat of trial ``number`` (storage id ``trial_id``, from ``first_beat``, which recorded the
    first) every interval until the block ends (nothing without heartbeats)."""
    interval = storage.get_heartbeat_interval()
    if interval is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # noqa: BLE001 - a missed beat (the database briefly away): the next one may land
                continue

    thread = threading.Thread(target=beat, name=f"optuna-heartbeat-{number}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)


__all__ = ["GRACE_INTERVALS", "HEARTBEAT_S", "MAX_RETRY", "NOT_INHERITED", "RetryStaleTrial", "ask", "beating",
           "fail_stale_trials", "first_beat", "frozen_trial", "heartbeat_storage", "inheritable", "queued_again",
           "retried_trial", "retry", "retry_chain", "stable_enough", "trial_id_of"]
