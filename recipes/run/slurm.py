"""A recipe under SLURM: the pre-kill signal stops the run cleanly and requeues the job; the requeued job resumes the
same run from its ``last.ckpt`` with no extra flag.

SLURM sends a signal before it kills a job (``#SBATCH --signal=USR1@90``: SIGUSR1 90 s before the end of the time
limit or a preemption). Lightning's own handling (``SLURMEnvironment(auto_requeue=True)``, its default when it
detects SLURM) calls ``logger.finalize("finished")`` in the signal handler (the run would read FINISHED), writes
``hpc_ckpt_<n>.ckpt`` in ``default_root_dir`` (outside the run's stamped checkpoints) and bypasses loopwise's stop at
a batch boundary. So under SLURM a recipe runs with ``SLURMEnvironment(auto_requeue=False)`` (``with_requeue_off``),
and loopwise handles the signal itself:

* ``StopOnSignal`` treats SIGUSR1 as it treats SIGTERM (every DDP rank stops after the same batch, rank 0 saves the
  run's stamped ``last.ckpt``, the run ends KILLED, exit 138), then ``requeue`` runs ``scontrol requeue <job>``;
* the run carries the tag ``loopwise.slurm_job`` (``<job id>``, or ``<array job id>_<task id>`` in an array);
* the requeued job (``SLURM_RESTART_COUNT`` >= 1) finds that job's newest fit run the signal stopped (KILLED) and
  resumes it with
  ``--ckpt_path run:<id>/last`` (``requeued_checkpoint``), as the same MLflow run, exactly; an explicit
  ``--ckpt_path`` wins.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.fabric.plugins.environments import ClusterEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.utilities.exceptions import SIGTERMException

from recipes.callbacks.stop_on_signal import SIGNAL_EXIT_CODES

JOB_TAG = "loopwise.slurm_job"


def under_slurm() -> bool:
    """Whether this process is a SLURM task that Lightning would treat as one (``SLURMEnvironment.detect``: not an
    interactive ``srun bash``)."""
    return SLURMEnvironment.detect()


def step_tasks() -> int:
    """How many tasks ``srun`` started for this job step (``SLURM_NTASKS``), each a process of its own; 1 outside
    SLURM and under ``torchrun`` (which starts the processes itself)."""
    if not under_slurm() or TorchElasticEnvironment.detect():
        return 1
    try:
        return max(1, int(os.environ.get("SLURM_NTASKS", "1")))
    except ValueError:
        return 1


def slurm_job() -> str | None:
    """The job this process belongs to as ``scontrol requeue`` names it: ``<array job>_<task>`` in an array, else
    ``SLURM_JOB_ID``; ``None`` outside SLURM."""
    if not under_slurm():
        return None
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def with_requeue_off(plugins: Any) -> Any:
    """The trainer's ``plugins`` with ``SLURMEnvironment(auto_requeue=False)`` added under SLURM (unless a cluster
    environment is given, or ``torchrun`` started the process, whose environment Lightning puts first): loopwise,
    not Lightning, handles the requeue signal (see the module)."""
    if not under_slurm() or TorchElasticEnvironment.detect():
        return plugins
    given = [] if plugins is None else (list(plugins) if isinstance(plugins, (list, tuple)) else [plugins])
    if any(isinstance(p, ClusterEnvironment) for p in given):
        return plugins
    return [*given, SLURMEnvironment(auto_requeue=False)]


def job_tags() -> dict[str, str]:
    """The run's tag naming its SLURM job (none outside SLURM)."""
    job = slurm_job()
    return {JOB_TAG: job} if job else {}


def requeue() -> str:
    """``scontrol requeue <job>`` for this job; the line that says what happened."""
    job = slurm_job()
    if job is None:
        return "not a SLURM job: nothing requeued"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"scontrol requeue {job} failed ({err}); resubmit the job to continue the run"
    if done.returncode != 0:
        reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        return f"scontrol requeue {job} failed ({reason[0]}); resubmit the job to continue the run"
    return f"requeued SLURM job {job}; it resumes this run from last.ckpt"


@contextmanager
def requeue_signal_stops() -> Iterator[None]:
    """Under SLURM, SIGUSR1 outside a fit's training (setup, validation, a test, a sweep between trials) ends the
    command as a stop by that signal (``SIGTERMException``, exit 138, then the requeue), instead of the signal's
    default action (the process killed, nothing requeued); during training ``StopOnSignal`` handles it at a batch
    boundary. The previous handler is put back after the block."""
    if not under_slurm() or threading.current_thread() is not threading.main_thread():  # handlers: main thread only
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SIGTERMException(SIGNAL_EXIT_CODES["SIGUSR1"])

    previous = signal.signal(signal.SIGUSR1, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


def requeued_checkpoint(tracking_uri: str, experiment: str, checkpoints_dir: str) -> str | None:
    """``run:<id>/last`` of this job's newest fit run when this is a requeued SLURM job (``SLURM_RESTART_COUNT`` >=
    1) and that run has a ``last.ckpt``; else ``None`` (a first start, or a job killed before its first checkpoint:
    it starts a new run). Says which in one line."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    job = slurm_job()
    if job is None or not restarts.isdigit() or int(restarts) < 1:
        return None
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    runs = [] if found is None else client.search_runs(  # a run this job's signal stopped (not one it finished)
        [found.experiment_id],
        f"tags.`{JOB_TAG}` = '{job}' and tags.`loopwise.stage` = 'fit' and attributes.status = 'KILLED'",
        order_by=["attributes.start_time DESC"], max_results=1)
    says = os.environ.get("SLURM_PROCID", "0") == "0"  # under DDP every task looks; the first one says so
    if not runs or not (Path(checkpoints_dir) / experiment / runs[0].info.run_id / "last.ckpt").is_file():
        if says:
            print(f"recipes: SLURM job {job} restarted (restart {restarts}) with no run of it to resume: a new run",
                  file=sys.stderr, flush=True)
        return None
    run_id = runs[0].info.run_id
    if says:
        print(f"recipes: SLURM job {job} restarted (restart {restarts}): resuming run {run_id} from its last.ckpt",
              file=sys.stderr, flush=True)
    return f"run:{run_id}/last"


__all__ = ["JOB_TAG", "job_tags", "requeue", "requeue_signal_stops", "requeued_checkpoint", "slurm_job", "step_tasks",
           "under_slurm", "with_requeue_off"]
