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
