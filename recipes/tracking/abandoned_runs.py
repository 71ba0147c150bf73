"""Runs left RUNNING by a process that died without closing them (kill -9, the OOM killer, a power loss).

Every recipe run is tagged with the host and process id that writes it (``loopwise.host``, ``loopwise.pid``). When a
command opens an experiment, the runs of that experiment still RUNNING whose process was on this host and no longer
exists are ended KILLED, with the tag ``loopwise.abandoned`` saying so. Runs of other hosts are left alone (their
process cannot be checked from here), and so is a run whose process id belongs to a live process (also when the id
was reused: leaving a run RUNNING is the safe mistake).

A sweep's parent run has many processes, its workers: each tags it ``loopwise.worker/<host>/<pid>`` (``running``,
then ``ended``; ``recipes.sweep.workers``). It is abandoned when none of them is still ``running`` and alive: a
worker of another host, or a live one, keeps it open. Closed, it gets its final trial counts
(``recipes.tracking.sweep_counts``: the study's when its storage can be read, else its trials' runs').

A fit closes those of its experiment when it starts (``close_abandoned_runs``); ``recipes compare`` those of every
experiment before it reads the store (``close_before_reading``), after the journals are replayed.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from recipes.tracking.sweep_counts import record_final_counts

HOST_TAG = "loopwise.host"
PID_TAG = "loopwise.pid"
ABANDONED_TAG = "loopwise.abandoned"
WORKER_TAG_PREFIX = "loopwise.worker/"


def process_tags() -> dict[str, str]:
    """The tags that name the process writing a run."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def worker_tag() -> str:
    """The tag that names this process as one of a sweep parent run's workers."""
    return f"{WORKER_TAG_PREFIX}{socket.gethostname()}/{os.getpid()}"


def workers_alive(tags: dict[str, str], host: str) -> bool | None:
    """Whether any worker named in a run's tags may still be working (``None``: the run has no worker tags): a
    ``running`` one of another host (not checkable from here), this process, or a live process."""
    workers = {key[len(WORKER_TAG_PREFIX):]: value for key, value in tags.items() if key.startswith(WORKER_TAG_PREFIX)}
    if not workers:
        return None
    for worker, state in workers.items():
        worker_host, _, pid = worker.rpartition("/")
        if state != "running":
            continue
        if worker_host != host or not pid.isdigit() or int(pid) == os.getpid() or process_exists(int(pid)):
            return True
    return False


def process_exists(pid: int) -> bool:
    """Whether a process with id ``pid`` exists on this host (one of another user counts)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_abandoned(client: Any, run_id: str, reason: str) -> None:
    """Tag ``run_id`` with ``ABANDONED_TAG``: ``reason``. A batch write: several commands may mark the same run at
    once (workers of a sweep starting together, two commands replaying one journal) and insert the tag together;
    MLflow's ``set_tag`` then fails the loser, its ``log_batch`` tries again and updates the row."""
    from mlflow.entities import RunTag  # noqa: PLC0415

    client.log_batch(run_id, tags=[RunTag(ABANDONED_TAG, reason)], synchronous=True)


def unmark_abandoned(tracking_uri: str, run_id: str) -> bool:
    """A run resumed (``--ckpt_path last``) goes on: the ``loopwise.abandoned`` tag that said why a later command
    ended it KILLED no longer holds and is removed (a resume killed again is tagged again by the command after it);
    whether it was there. A store that refuses it leaves the tag (the run's own writes say what failed)."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    try:
        if ABANDONED_TAG not in client.get_run(run_id).data.tags:
            return False
        client.delete_tag(run_id, ABANDONED_TAG)
    except MlflowException:
        return False
    return True


def close_abandoned_runs(tracking_uri: str, experiment: str) -> list[str]:
    """End KILLED the RUNNING runs of ``experiment`` whose process on this host is gone; their ids."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return []
    except MlflowException:
        return []
    return [run_id for run_id, _ in close_abandoned_in(client, [found.experiment_id])]


def close_abandoned_in(client: Any, experiment_ids: list[str]) -> list[tuple[str, str]]:
    """End KILLED the abandoned RUNNING runs of the experiments ``experiment_ids`` (see the module); each closed
    run's id and a line saying what was done."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    if not experiment_ids:
        return []
    try:
        running = client.search_runs(experiment_ids, "attributes.status = 'RUNNING'")
    except MlflowException:
        return []
    host, closed = socket.gethostname(), []
    for run in running:
        tags = run.data.tags
        pid = tags.get(PID_TAG, "")
        workers = workers_alive(tags, host)
        if workers is not None:  # a sweep's parent run
            if workers:
                continue
            reason = (f"every worker of this sweep on {host} ended without closing its parent run (kill -9, out of "
                      "memory, power loss); marked KILLED by a later command. Running the sweep command again "
                      "continues the study (the dead worker's trial is failed and does not count).")
        elif tags.get(HOST_TAG) != host or not pid.isdigit() or int(pid) == os.getpid() or process_exists(int(pid)):
            continue
        else:
            reason = (f"process {pid} on {host} ended without closing the run (kill -9, out of memory, power loss); "
                      "marked KILLED by a later command. `--ckpt_path last` resumes it from its last checkpoint, "
                      "if any.")
        run_id = run.info.run_id
        mark_abandoned(client, run_id, reason)
        if workers is not None:
            counts = record_final_counts(client, run)
            line = (f"sweep run {run_id} (study {tags.get('loopwise.sweep.study', '?')!r}): every worker is gone; "
                    f"marked KILLED with its trial counts: {counts}")
        else:
            line = f"run {run_id} was left RUNNING by a process that no longer exists: marked KILLED"
        client.set_terminated(run_id, "KILLED")
        closed.append((run_id, line))
    return closed


def close_before_reading(tracking_uri: str, prog: str) -> None:
    """For a command about to read the store (``recipes compare``): close the abandoned runs of every experiment
    (``close_abandoned_in``), one line each on stderr (``prog`` first); a store that refuses the writes is said in
    one line, and the command goes on reading what the store holds."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    try:
        client = MlflowClient(tracking_uri)
        ids = [e.experiment_id for e in client.search_experiments(max_results=50000)]
        closed = close_abandoned_in(client, ids)
    except Exception as err:  # noqa: BLE001  (the command reads the store as it is; its own errors follow)
        from recipes.tracking.failures import short_reason  # noqa: PLC0415

        print(f"{prog}: runs left RUNNING by processes that no longer exist were not closed ({short_reason(err)}); "
              "the store shows them RUNNING", file=sys.stderr)
        return
    for _, line in closed:
        print(f"{prog}: {line}", file=sys.stderr)


__all__ = [
    "ABANDONED_TAG",
    "WORKER_TAG_PREFIX",
    "close_abandoned_in",
    "close_abandoned_runs",
    "close_before_reading",
    "mark_abandoned",
    "process_exists",
    "process_tags",
    "unmark_abandoned",
    "worker_tag",
    "workers_alive",
]
