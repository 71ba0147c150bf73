"""Issue 58, point 2: a preempted SLURM job requeues and resumes exactly. SLURM's variables are set as a one-task job
sets them, ``scontrol`` is a stub on ``PATH`` that records its arguments, and the pre-kill signal is a real SIGUSR1
to the process: the fit stops after that batch with the run's ``last.ckpt`` and the run KILLED (not Lightning's
``finalize("finished")`` and ``hpc_ckpt_1.ckpt``), the job is requeued, and the same command in the requeued job
(``SLURM_RESTART_COUNT=1``, no ``--ckpt_path``) resumes the same MLflow run to the weights an uninterrupted run
ends with, bit for bit."""

from __future__ import annotations

import os
import signal
import stat

import pytest
from lightning.pytorch.callbacks import Callback

from recipes.run.slurm import JOB_TAG, slurm_job, with_requeue_off
from tests.conftest import runs_of
from tests.exact_resume_runs import assert_same_training_state, fit, last_of

SLURM = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "train", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "127.0.0.1"}


class SigusrAtStep(Callback):
    """SIGUSR1 to this process after global step ``step``, as SLURM's ``--signal=USR1@90`` sends it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGUSR1)


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """A stub ``scontrol`` first on PATH; the file its calls' arguments are appended to."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls"
    bin_dir.mkdir()
    stub = bin_dir / "scontrol"
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_the_job_is_named_as_scontrol_names_it_and_lightning_requeue_is_off_only_under_slurm(monkeypatch):
    for key in SLURM:
        monkeypatch.delenv(key, raising=False)
    assert slurm_job() is None and with_requeue_off(None) is None
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    assert slurm_job() == "4242"
    [environment] = with_requeue_off(None)
    assert environment.auto_requeue is False
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert slurm_job() == "4240_2"
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # an interactive allocation: not a batch job (Lightning's rule)
    assert slurm_job() is None


@pytest.mark.slow
def test_a_preempted_job_is_requeued_and_resumes_the_same_run_exactly(workdir, monkeypatch, scontrol, capsys):
    recipe, epochs = "spiral_mlp", ["--trainer.max_epochs", "3"]
    fit(monkeypatch, recipe, *epochs)  # the uninterrupted run, outside SLURM
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        fit(monkeypatch, recipe, *epochs, extra_callbacks=[SigusrAtStep(8)])
    assert exc.value.code == 128 + signal.SIGUSR1
    err = capsys.readouterr().err
    assert "recipes: stopped by SIGUSR1 (run marked KILLED, last.ckpt saved)" in err
    assert "recipes: requeued SLURM job 4242; it resumes this run from last.ckpt" in err
    assert scontrol.read_text().split() == ["requeue", "4242"]
    straight, preempted = runs_of(workdir, recipe)
    assert preempted.info.status == "KILLED" and preempted.data.tags[JOB_TAG] == "4242"
    assert last_of(workdir, recipe, preempted.info.run_id)["global_step"] == 8
    assert not list(workdir.rglob("hpc_ckpt_*.ckpt"))  # Lightning's own requeue checkpoint is not written

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued job runs the same command
    fit(monkeypatch, recipe, *epochs)
    assert f"resuming run {preempted.info.run_id} from its last.ckpt" in capsys.readouterr().err
    runs = runs_of(workdir, recipe)
    assert len(runs) == 2 and runs[1].info.run_id == preempted.info.run_id
    assert runs[1].info.status == "FINISHED"
    a, b = last_of(workdir, recipe, straight.info.run_id), last_of(workdir, recipe, preempted.info.run_id)
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"])
    assert_same_training_state(a, b)


def test_sigusr1_outside_training_stops_the_command_as_a_requeue_stop_under_slurm_only(monkeypatch):
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from recipes.run.slurm import requeue_signal_stops

    before = signal.getsignal(signal.SIGUSR1)
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SIGTERMException) as stop, requeue_signal_stops():
        os.kill(os.getpid(), signal.SIGUSR1)
    assert stop.value.code == 128 + signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before  # put back after the command
    monkeypatch.setenv("SLURM_JOB_NAME", "bash")  # not a batch job: nothing installed
    with requeue_signal_stops():
        assert signal.getsignal(signal.SIGUSR1) == before


def test_a_sweep_trial_never_resumes_the_job_s_run():
    from recipes.run.recipes_cli import RecipesCLI
    from recipes.sweep.trial_cli import TrialCLI

    assert RecipesCLI.resumes_requeued_job(None) and not TrialCLI.resumes_requeued_job(None)


def srun_pair(directory, *args: str, restart: int | None = None) -> list:
    """What ``srun`` does for a 2-task job step on one node: the same ``recipes fit`` started twice, each process with
    its task's SLURM variables (``SLURM_PROCID`` 0 and 1), 2 CPU processes of DDP (gloo) that Lightning's
    ``SLURMEnvironment`` joins, as it does under a real srun; (returncode, stdout, stderr) per rank."""
    import subprocess
    import sys

    from tests.conftest import CONFIGS, DDP, free_port, recipes_env

    env = {**recipes_env(), **SLURM, "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "MASTER_PORT": str(free_port()),
           "OMP_NUM_THREADS": "1"}
    env.pop("SLURM_RESTART_COUNT", None)
    if restart is not None:
        env["SLURM_RESTART_COUNT"] = str(restart)
    command = [sys.executable, "-m", "recipes", "fit", "-c", str(CONFIGS / "spiral_mlp.yaml"), "-c", str(DDP),
               "--trainer.accelerator", "cpu", "--trainer.devices", "2", "--trainer.max_epochs", "2",
               "--mlflow_model", "false", "--system_metrics_interval", "0", "--torch_threads", "1", *args]
    ranks = [subprocess.Popen(command, cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)}) for rank in (0, 1)]
    out = []
    for process in ranks:
        stdout, stderr = process.communicate(timeout=420)
        out.append((process.returncode, stdout, stderr))
    return out


@pytest.mark.slow
def test_sigusr1_to_both_ranks_of_a_ddp_job_stops_them_together_requeues_once_and_resumes_exactly(
        workdir, monkeypatch, scontrol):
    """Issue 58: SLURM signals every task of the job step. Both DDP ranks get SIGUSR1 after step 4 (epoch 0 of 2,
    11 steps an epoch per rank); they agree to stop after the same batch, rank 0 saves last.ckpt and marks the run
    KILLED, both exit 138, and the job is requeued once. The requeued step (``SLURM_RESTART_COUNT=1``, the same
    command) resumes the same run to the weights of an uninterrupted 2-rank run, bit for bit."""
    import json

    stop = {"class_path": "tests.checkpoints.test_slurm_requeue.SigusrAtStep", "init_args": {"step": 4}}
    straight = srun_pair(workdir)
    assert [rc for rc, _, _ in straight] == [0, 0], straight[0][2][-3000:] + straight[1][2][-3000:]
    stopped = srun_pair(workdir, f"--trainer.callbacks+={json.dumps(stop)}")
    assert [rc for rc, _, _ in stopped] == [128 + signal.SIGUSR1] * 2, stopped[0][2][-3000:] + stopped[1][2][-3000:]
    assert "recipes: requeued SLURM job 4242" in stopped[0][2] and "requeued" not in stopped[1][2]
    assert scontrol.read_text().split() == ["requeue", "4242"]  # once, by rank 0
    first, preempted = runs_of(workdir, "spiral_mlp")
    assert preempted.info.status == "KILLED"
    assert last_of(workdir, "spiral_mlp", preempted.info.run_id)["global_step"] == 4
    resumed = srun_pair(workdir, restart=1)
    assert [rc for rc, _, _ in resumed] == [0, 0], resumed[0][2][-3000:] + resumed[1][2][-3000:]
    assert f"resuming run {preempted.info.run_id} from its last.ckpt" in resumed[0][2]
    runs = runs_of(workdir, "spiral_mlp")
    assert len(runs) == 2 and runs[1].info.status == "FINISHED"
    assert_same_training_state(last_of(workdir, "spiral_mlp", first.info.run_id),
                               last_of(workdir, "spiral_mlp", preempted.info.run_id))


def test_a_sweep_in_a_job_step_of_several_tasks_is_one_line_before_anything(monkeypatch, capsys, workdir):
    """``srun`` with 2 tasks would start two sweep workers that DDP joins, each with its own trial (seen: rank 0
    waited forever for a rank 1 that had ended; with more trials the two would train different values as one model):
    each task stops at once with one line naming the fix. One task per worker is the job array's way."""
    from recipes.sweep.command import main
    from tests.conftest import SPIRAL
    from tests.sweep_runs import SWEEP

    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert main(["-c", str(SPIRAL), "-c", str(SWEEP), "--n_trials", "1"]) == 2
    [line] = [l for l in capsys.readouterr().err.splitlines() if l.startswith("recipes")]
    assert line.startswith("recipes sweep: error: this SLURM job step runs 2 tasks (SLURM_NTASKS=2): ")
    assert "#SBATCH --ntasks-per-node=1" in line
    assert not (workdir / "optuna.db").exists()  # nothing opened
    monkeypatch.setenv("SLURM_NTASKS", "1")  # the job array's task: one worker
    from recipes.run.slurm import step_tasks

    assert step_tasks() == 1
