"""Runs left RUNNING by a process that died without closing them (kill -9, the OOM killer, a power loss).

Every recipe run is tagged with the host and process id that writes it (``loopwise.host``, ``loopwise.pid``). When a
command opens an experiment, the runs of that experiment still RUNNING whose process was on this host and no longer
exists are ended KILLED, with the tag ``loopwise.abandoned`` saying so. Runs of other hosts are left alone (their
process cannot be checked from here), and so is a run whose process id belongs to a live process (also when the id
was reused: leaving a run RUNNING is the safe mistake).
"""

from __future__ import annotations

import os
import socket

HOST_TAG = "loopwise.host"
PID_TAG = "loopwise.pid"
ABANDONED_TAG = "loopwise.abandoned"


def process_tags() -> dict[str, str]:
    """The tags that name the process writing a run."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


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


def close_abandoned_runs(tracking_uri: str, experiment: str) -> list[str]:
    """End KILLED the RUNNING runs of ``experiment`` whose process on this host is gone; their ids."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return []
        running = client.search_runs([found.experiment_id], "attributes.status = 'RUNNING'")
    except MlflowException:
        return []
    host, closed = socket.gethostname(), []
    for run in running:
        tags = run.data.tags
        pid = tags.get(PID_TAG, "")
        if tags.get(HOST_TAG) != host or not pid.isdigit() or int(pid) == os.getpid() or process_exists(int(pid)):
            continue
        client.set_tag(
            run.info.run_id,
            ABANDONED_TAG,
            f"process {pid} on {host} ended without closing the run (kill -9, out of memory, power loss); "
            "marked KILLED by a later command. `--ckpt_path last` resumes it from its last checkpoint, if any.",
        )
        client.set_terminated(run.info.run_id, "KILLED")
        closed.append(run.info.run_id)
    return closed


__all__ = ["ABANDONED_TAG", "close_abandoned_runs", "process_exists", "process_tags"]
