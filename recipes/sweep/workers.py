"""The processes working on a sweep, and what a dead one leaves behind.

Every ``recipes sweep`` process is a worker of its study's MLflow parent run: it tags the parent
``loopwise.worker/<host>/<pid>`` = ``running`` when it starts and ``ended`` when it stops, and tags each trial it
asks for with its host and pid (Optuna user attributes ``loopwise.host``, ``loopwise.pid``). A worker that died
without ending (``kill -9``, the OOM killer) leaves the parent RUNNING and its trial RUNNING in Optuna:

* the parent is ended KILLED by the next command that opens the experiment on this host once no worker of it is
  alive (``recipes.tracking.abandoned_runs``; a worker of another host keeps it open, since it cannot be checked from here);
* its trial is failed by the next worker of the study on this host (``fail_abandoned_trials``; on another host, by
  its missing heartbeats, ``recipes.sweep.heartbeat``), as an interrupted trial, and queued again with the same
  values (a WAITING trial the next ``ask`` takes): it does not count toward ``--n_trials`` (its number is kept in the
  study's user attribute ``loopwise.abandoned_trials``); the trial's own MLflow run carries ``loopwise.pid`` and is
  ended KILLED like any recipe run. A worker that is still running checks before every trial it starts and when it
  ends, so a worker killed beside it costs no trial of the budget;
* its ``loopwise.worker/<host>/<pid>`` tag on the parent says ``died`` once a worker of this host has seen that its
  process is gone (``mark_dead_workers``).
"""

from __future__ import annotations

import os
import socket

import optuna
from mlflow.tracking import MlflowClient
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import TrialState

from recipes.sweep.heartbeat import retry
from recipes.tracking.abandoned_runs import HOST_TAG, PID_TAG, WORKER_TAG_PREFIX, process_exists, worker_tag
from recipes.tracking.sweep_counts import ABANDONED_TRIALS_ATTR

ABANDONED_ATTR = ABANDONED_TRIALS_ATTR  # defined where a later command reads it to count a dead sweep's trials
DIED = "died"  # the worker tag of a process that ended without saying so (kill -9, out of memory)


def mark_worker(client: MlflowClient, parent_run_id: str, state: str) -> None:
    """Tag the parent run with this process as a worker: ``running`` or ``ended``."""
    client.set_tag(parent_run_id, worker_tag(), state)


def mark_dead_workers(client: MlflowClient, parent_run_id: str) -> list[str]:
    """Tag ``died`` the workers of this host that the parent run still names ``running`` and whose process is gone;
    their tags."""
    host = socket.gethostname()
    dead = []
    for key, state in client.get_run(parent_run_id).data.tags.items():
        worker_host, _, pid = key[len(WORKER_TAG_PREFIX):].rpartition("/")
        if (key.startswith(WORKER_TAG_PREFIX) and state == "running" and worker_host == host and pid.isdigit()
                and int(pid) != os.getpid() and not process_exists(int(pid))):
            client.set_tag(parent_run_id, key, DIED)
            dead.append(key)
    return dead


def claim_trial(trial: optuna.Trial) -> None:
    """Name this process as the worker of ``trial`` (so another worker can tell when it died)."""
    trial.set_user_attr(HOST_TAG, socket.gethostname())
    trial.set_user_attr(PID_TAG, os.getpid())


def abandoned_trials(study: optuna.Study) -> set[int]:
    """Numbers of the trials failed because their worker died."""
    return {int(n) for n in study.user_attrs.get(ABANDONED_ATTR, [])}


def fail_abandoned_trials(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials whose worker was a process of this host that no longer exists, and queue each again
    (``heartbeat.retry``: a WAITING trial with its values, without its dead worker's pid); their numbers (not a trial
    another worker failed or told meanwhile). (Call it holding ``trial_start_lock`` on a SQLite study: the study's
    list of them is read, then written.)"""
    host, found = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = trial.user_attrs.get(PID_TAG)
        if trial.user_attrs.get(HOST_TAG) != host or not isinstance(pid, int) or pid == os.getpid():
            continue
        if process_exists(pid):
            continue
        try:
            study.tell(trial.number, state=TrialState.FAIL)
        except (ValueError, UpdateFinishedTrialError):  # another worker failed (or its own worker told) it first
            continue
        retry(study, trial)
        found.append(trial.number)
    if found:
        record_abandoned(study, found)
    return found


def record_abandoned(study: optuna.Study, numbers: list[int]) -> None:
    """Keep ``numbers`` in the study's list of trials failed because their worker died (counted as interrupted)."""
    study.set_user_attr(ABANDONED_ATTR, sorted(abandoned_trials(study) | set(numbers)))


__all__ = ["ABANDONED_ATTR", "DIED", "abandoned_trials", "claim_trial", "fail_abandoned_trials",
           "mark_dead_workers", "mark_worker", "record_abandoned"]
