"""Issue 58: a sweep trial whose worker was killed is retried from the last checkpoint it left, not from scratch.

The retry is a new Optuna trial (Optuna's retry semantics: same values, ``retried_trial_number``) with an MLflow run of
its own, linked to the killed one (``loopwise.sweep.retry_of_*``, ``loopwise.resumed_from_*``), holding the killed
run's history before the checkpoint; it trains on from that checkpoint exactly, and its objective and pruning see the
values the killed trial reported before it.
"""

from __future__ import annotations

import math
import signal
import time

import pytest
import torch
from optuna.trial import TrialState

from recipes.cli import main
from recipes.sweep.heartbeat import retried_trial, retry_chain
from recipes.sweep.space import as_cli_value
from recipes.sweep.trial import ActiveTrial, RetryOf
from recipes.sweep.trial_cli import trial_arguments
from recipes.tracking.journal import JOURNAL_NAME, read_journal
from recipes.sweep.runner import last_checkpoint_of
from recipes.sweep.trial_cli import TrialCLI
from tests.checkpoints.test_slurm_requeue import SLURM, SigusrAtStep, scontrol  # noqa: F401 - the fixture
from tests.conftest import SPIRAL, mlflow_client, runs_of
from tests.exact_resume_runs import assert_same_training_state, last_of
from tests.sweep.test_sweep_endings import start_sweep
from tests.sweep_runs import SHORT, study_of, sweep

pytestmark = pytest.mark.usefixtures("one_thread")

EPOCHS = "20"


def checkpointed_after_a_validation(workdir) -> bool:
    """Whether the worker's trial has saved a checkpoint past its first epoch (its journal says so)."""
    journals = list((workdir / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}"))
    return bool(journals) and any(
        e["kind"] == "tags" and int(e["values"].get("loopwise.checkpoint_step", 0) or 0) > 0
        for e in read_journal(journals[0])
    )


@pytest.mark.slow
def test_a_killed_trial_is_retried_from_its_last_checkpoint_and_ends_as_if_never_killed(workdir, capsys, monkeypatch):
    """Two validations an epoch (``val_check_interval 0.5``): the checkpoint may be in the middle of an epoch, and
    Optuna keeps one value an epoch, so the retry's objective must come from the killed run's history."""
    import recipes.sweep.runner as runner

    recorded: dict[int, list[float]] = {}
    real = runner.record_trial

    def keep_values(study, client, trial, active, *rest):
        recorded[trial.number] = list(active.values)
        return real(study, client, trial, active, *rest)

    monkeypatch.setattr(runner, "record_trial", keep_values)
    twice = ["--trainer.val_check_interval", "0.5"]
    dead = start_sweep(workdir, "--n_trials", "1", "--trainer.max_epochs", EPOCHS, *twice)
    deadline = time.monotonic() + 180
    while not checkpointed_after_a_validation(workdir):
        assert dead.poll() is None, dead.communicate()
        assert time.monotonic() < deadline, "the trial saved no checkpoint after a validation"
        time.sleep(0.05)
    dead.kill()  # kill -9, in the middle of its training
    dead.wait(timeout=60)

    # the same command again, on this host: trial 0's worker is gone, trial 1 repeats it from its last.ckpt
    assert sweep("--n_trials", "1", "--trainer.max_epochs", EPOCHS, "--torch_threads", "1", *twice) == 0
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert retried_trial(study, 1) == 0 and retry_chain(study, 1) == [0]
    killed_trial, retry = study.trials
    runs = {int(r.data.tags["loopwise.sweep.trial"]): r for r in runs_of(workdir, "spiral_mlp")
            if r.data.tags.get("loopwise.stage") == "fit"}
    killed_run, retry_run = runs[0].info.run_id, runs[1].info.run_id
    out = capsys.readouterr().out
    assert (f"trial 1 retries trial 0 (its worker died) with the same values; the killed trial's run: {killed_run}; "
            f"it trains on from that run's last checkpoint (run:{killed_run}/last)") in out
    tags = runs[1].data.tags
    assert tags["loopwise.sweep.retry_of_run"] == killed_run and tags["loopwise.resumed_from_run"] == killed_run
    resumed_at = int(tags["loopwise.resumed_from_step"])
    assert resumed_at > 0 and runs[0].info.status == "KILLED" and runs[1].info.status == "FINISHED"

    # the uninterrupted run of the same values: the retry ends exactly there, with the same validation curve
    best = (workdir / "best.yaml").read_text()  # the winner is the retry: best.yaml trains it from the start
    assert "ckpt_path: null" in best and "resumed_from" not in best and killed_run not in best.split("\n", 2)[2]
    straight, last = straight_fit(workdir, retry.params, "--trainer.max_epochs", EPOCHS, *twice)
    assert_same_training_state(last, last_of(workdir, "spiral_mlp", retry_run))
    client = mlflow_client(workdir)
    curve = {run_id: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, "val/acc"),
                                                        key=lambda m: m.step)]
             for run_id in (straight.info.run_id, retry_run)}
    assert len(curve[retry_run]) == 2 * int(EPOCHS) and curve[retry_run] == curve[straight.info.run_id]

    # the objective is the best over the whole trajectory: every validation of the killed trial before the
    # checkpoint counts (from its run's history), and Optuna's pruner sees one value an epoch, the killed ones too
    assert recorded[1] == [value for _, value in curve[straight.info.run_id]]
    assert retry.value == max(recorded[1])
    assert killed_trial.intermediate_values  # it reported validations before it was killed
    assert sorted(retry.intermediate_values) == list(range(int(EPOCHS)))
    for epoch, value in killed_trial.intermediate_values.items():
        assert math.isclose(retry.intermediate_values[epoch], value, rel_tol=1e-6)


def test_a_retry_resumes_from_the_killed_trials_checkpoint_and_takes_its_earlier_values():
    """Unit: the retry's fit arguments name the killed run's last checkpoint; the values it reported before the
    epoch training resumes at are the retry's (none when it starts from scratch)."""
    retry = RetryOf(3, "abc", "run:abc/last", {0: 0.5, 1: 0.7, 2: 0.6})
    active = ActiveTrial(None, 5, "s", None, "val/acc", "maximize", {"data.init_args.batch_size": 64}, retry_of=retry)
    assert trial_arguments(["-c", "x.yaml"], active)[-2:] == ["--data.init_args.batch_size=64",
                                                              "--ckpt_path=run:abc/last"]
    assert active.reported_through(1) == [(0, 0.5), (1, 0.7)]
    active.retry_of = RetryOf(3, "abc", "run:abc/last", {}, [(6, 0.5), (13, 0.6), (20, 0.7)])
    assert active.validated_before(20) == [0.5, 0.6]  # a validation logs at the step before its checkpoint's
    assert active.tags()["loopwise.sweep.retry_of_trial"] == "3"
    scratch = ActiveTrial(None, 5, "s", None, "val/acc", "maximize", {}, retry_of=RetryOf(3, "abc", None, {0: 0.5}))
    assert scratch.reported_through(2) == [] and not any(a.startswith("--ckpt_path") for a in
                                                        trial_arguments([], scratch))


def straight_fit(workdir, params: dict, *extra: str) -> tuple:
    """The uninterrupted fit of a trial's values (a plain ``recipes fit``): its run and last checkpoint."""
    values = [f"--{key}={as_cli_value(value)}" for key, value in params.items()]
    main(["fit", "-c", str(SPIRAL), *SHORT, "--torch_threads", "1", *extra, *values])
    [straight] = [r for r in runs_of(workdir, "spiral_mlp") if "loopwise.sweep.trial" not in r.data.tags
                  and r.data.tags.get("loopwise.stage") == "fit"]
    return straight, last_of(workdir, "spiral_mlp", straight.info.run_id)


@pytest.mark.slow
def test_a_preempted_sweep_is_requeued_and_its_trial_trains_on_from_the_signal_s_checkpoint(
        workdir, monkeypatch, scontrol, capsys):
    """Under SLURM the pre-kill signal (SIGUSR1) in the middle of a trial's epoch: the trial saves last.ckpt, is
    failed and queued again, the job requeued; the requeued job's sweep (the same command) trains the retry on from
    that mid-epoch checkpoint to the weights of an uninterrupted fit, bit for bit."""
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    real = TrialCLI.extra_callbacks
    monkeypatch.setattr(TrialCLI, "extra_callbacks",
                        lambda self: [*real(self), *([SigusrAtStep(8)] if self.trial.number == 0 else [])])
    assert sweep("--n_trials", "1", "--torch_threads", "1") == 128 + signal.SIGUSR1
    assert scontrol.read_text().split() == ["requeue", "4242"]
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.WAITING]
    [killed] = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "fit"]
    assert last_of(workdir, "spiral_mlp", killed.info.run_id)["global_step"] == 8  # in epoch 1 of 3

    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")  # the requeued job runs the same command
    capsys.readouterr()
    assert sweep("--n_trials", "1", "--torch_threads", "1") == 0
    assert f"it trains on from that run's last checkpoint (run:{killed.info.run_id}/last)" in capsys.readouterr().out
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    retry_run = next(r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.sweep.trial") == "1")
    assert retry_run.data.tags["loopwise.resumed_from_step"] == "8"
    for key in SLURM:
        monkeypatch.delenv(key)
    _, last = straight_fit(workdir, study.trials[1].params)
    assert_same_training_state(last, last_of(workdir, "spiral_mlp", retry_run.info.run_id))


def test_a_retry_starts_over_when_the_killed_checkpoint_is_past_the_commands_epochs(tmp_path):
    """The sweep's command now trains fewer epochs than the killed trial had (a re-run with a smaller
    ``--trainer.max_epochs``): Lightning cannot go on from there, so the retry starts over within the budget."""
    folder = tmp_path / "checkpoints" / "exp" / "run1"
    folder.mkdir(parents=True)
    torch.save({"epoch": 4, "global_step": 40}, folder / "last.ckpt")
    where = str(tmp_path / "checkpoints")
    client = None  # a local checkpoint is decided without the store
    assert last_checkpoint_of(client, "run1", "exp", where, max_epochs=10) == ("run:run1/last", "")
    assert last_checkpoint_of(client, "run1", "exp", where, max_epochs=None) == ("run:run1/last", "")
    assert last_checkpoint_of(client, "run1", "exp", where, max_epochs=4) == (
        None, "its last checkpoint is from epoch 4, the command trains 4 epochs")


def test_a_retry_of_a_retry_killed_before_its_first_checkpoint_trains_on_from_the_chains_newest(workdir, capsys):
    """Trial 0 left a last.ckpt; its retry, trial 1, was killed before saving one of its own; trial 2 repeats trial 1
    (its tag) and trains on from trial 0's checkpoint with trial 0's values."""
    import optuna

    from recipes.sweep.runner import retry_link
    from tests.conftest import mlflow_client

    client = mlflow_client(workdir)
    experiment = client.create_experiment("exp")
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{workdir / 'chain.db'}", direction="maximize")
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    history = [{}, {"failed_trial": 0, "retry_history": [0]}, {"failed_trial": 0, "retry_history": [0, 1]}]
    for number, (state, values) in enumerate([(TrialState.FAIL, {0: 0.5, 1: 0.6}), (TrialState.FAIL, {0: 0.5}),
                                              (TrialState.WAITING, None)]):
        study.add_trial(optuna.create_trial(state=state, params={"x": 0.3}, distributions=space,
                                            system_attrs=history[number], intermediate_values=values))
    runs = {}
    for number in (0, 1):
        runs[number] = client.create_run(experiment, tags={"loopwise.sweep.study": "s", "loopwise.stage": "fit",
                                                            "loopwise.sweep.trial": str(number)}).info.run_id
    folder = workdir / "checkpoints" / "exp" / runs[0]
    folder.mkdir(parents=True)
    torch.save({"epoch": 1, "global_step": 10}, folder / "last.ckpt")
    retry = retry_link(client, study, "exp", 2, str(workdir / "checkpoints"), max_epochs=5)
    assert retry == RetryOf(1, runs[1], f"run:{runs[0]}/last", {0: 0.5, 1: 0.6})  # no metric asked: no history
    assert (f"trial 2 retries trial 1 (its worker died) with the same values; the killed trial's run: {runs[1]}; it "
            f"trains on from trial 0's (the killed trial saved none of its own) last checkpoint (run:{runs[0]}/last)"
            in capsys.readouterr().out)


def test_a_retry_starts_over_while_a_live_process_still_trains_the_killed_run(tmp_path):
    """A worker taken for dead (its heartbeats stopped) may still be training: its run's lock is held, so the retry
    does not take its checkpoint (the fit would refuse the run) and starts from the start."""
    import subprocess
    import sys

    from recipes.checkpoints.run_lock import lock_path, run_lock_holder

    folder = tmp_path / "checkpoints" / "exp" / "run1"
    folder.mkdir(parents=True)
    torch.save({"epoch": 1, "global_step": 10}, folder / "last.ckpt")
    lock = lock_path(tmp_path / "checkpoints" / "exp", "run1")
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, sys, time\n"
        f"f = open({str(lock)!r}, 'a+'); fcntl.flock(f.fileno(), fcntl.LOCK_EX); f.write('process 7 on far')\n"
        "f.flush(); print('held', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert run_lock_holder(tmp_path / "checkpoints" / "exp", "run1") == "process 7 on far"
        assert last_checkpoint_of(None, "run1", "exp", str(tmp_path / "checkpoints")) == (
            None, "its run is still being trained by process 7 on far")
    finally:
        holder.kill()
        holder.wait()
    assert run_lock_holder(tmp_path / "checkpoints" / "exp", "run1") is None  # the OS released it with the process
    assert last_checkpoint_of(None, "run1", "exp", str(tmp_path / "checkpoints")) == ("run:run1/last", "")


def test_the_line_says_which_dead_trials_were_not_queued_again(tmp_path):
    """A trial whose values already ran MAX_RETRY + 1 times is failed but not retried: the line says so instead of
    "queued again"."""
    import optuna

    from recipes.sweep.heartbeat import MAX_RETRY, queued_again

    assert MAX_RETRY == 2
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'q.db'}")
    space = {"x": optuna.distributions.FloatDistribution(0.0, 1.0)}
    chains = [{}, {"failed_trial": 0, "retry_history": [0]}, {"failed_trial": 0, "retry_history": [0, 1]},
              {}, {"failed_trial": 3, "retry_history": [3]}]
    for attrs in chains:  # 0 -> 1 -> 2 (2 dead, not retried: 3 runs of its values); 3 -> 4 (waiting)
        state = TrialState.WAITING if attrs.get("retry_history") == [3] else TrialState.FAIL
        study.add_trial(optuna.create_trial(state=state, params={"x": 0.1}, distributions=space, system_attrs=attrs))
    assert queued_again(study, [3]) == "queued again with the same values"
    assert queued_again(study, [2]) == ("not queued again (their values already ran 3 times or more, each run "
                                        "stopped with its worker)")
    assert queued_again(study, [2, 3]).startswith("queued again with the same values, except 2 (whose values")


def test_ddp_followers_get_the_retrys_checkpoint_with_the_announced_trial(monkeypatch):
    """Under DDP every process resumes the same checkpoint: rank 0 announces the retry with it (the environment the
    launcher copies for the first trial), a follower builds the same fit arguments (the values reported before are
    rank 0's business)."""
    from recipes.sweep.processes import TRIAL_ENV, announce_trial, next_trial

    monkeypatch.delenv(TRIAL_ENV, raising=False)
    retry = RetryOf(3, "abc", "run:abc/last", {0: 0.5}, [(6, 0.5)])
    active = ActiveTrial(object(), 5, "s", "parent", "val/acc", "maximize", {"data.init_args.batch_size": 64},
                         retry_of=retry)
    announce_trial(active)
    followed = next_trial(first=True)
    assert followed.retry_of == RetryOf(3, "abc", "run:abc/last")
    assert trial_arguments(["-c", "x.yaml"], followed) == trial_arguments(["-c", "x.yaml"], active)
    assert followed.tags() == active.tags()


@pytest.mark.slow
def test_under_ddp_both_processes_train_the_retry_on_from_the_killed_trials_checkpoint(workdir, capsys):
    """A 2-process DDP sweep worker (rank 1 started by Lightning's launcher) is killed, both processes, in the middle
    of its trial; the same command again retries the trial on both processes from its last.ckpt, and ends with the
    weights of an uninterrupted 2-process fit of the same values, bit for bit."""
    import os
    import signal
    import subprocess
    import sys

    from tests.conftest import CONFIGS, DDP, on_two_processes, recipes_env
    from tests.preloaded_python import preloaded_run

    ddp = ["-c", str(DDP), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    args = [*SHORT, "--trainer.max_epochs", "8", "--torch_threads", "1", "--system_metrics_interval", "0"]
    command = [sys.executable, "-m", "recipes", "sweep", "-c", str(SPIRAL), "-c", str(CONFIGS / "sweeps" /
               "spiral_mlp.yaml"), *ddp, *args, "--n_trials", "1"]
    env = {**recipes_env(), "OMP_NUM_THREADS": "1"}
    dead = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group: rank 0 and the rank 1 it launches
    deadline = time.monotonic() + 240
    while not checkpointed_after_a_validation(workdir):
        assert dead.poll() is None, "the DDP sweep worker ended before it was killed"
        assert time.monotonic() < deadline, "the trial saved no checkpoint after a validation"
        time.sleep(0.05)
    os.killpg(dead.pid, signal.SIGKILL)  # kill -9 of both processes
    dead.wait(timeout=60)

    out = preloaded_run(command, cwd=workdir, env=env, timeout=420)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.FAIL, TrialState.COMPLETE]
    [killed] = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.sweep.trial") == "0"]
    assert f"it trains on from that run's last checkpoint (run:{killed.info.run_id}/last)" in out.stdout
    assert "recipes sweep: rank 1 follows trial 1: " in out.stdout
    retry = next(r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.sweep.trial") == "1")
    assert retry.info.status == "FINISHED" and retry.data.tags["loopwise.resumed_from_run"] == killed.info.run_id
    assert retry.data.params["plan.devices"] == "2" and int(retry.data.tags["loopwise.resumed_from_step"]) > 0

    values = [f"--{key}={as_cli_value(value)}" for key, value in study.trials[1].params.items()]
    on_two_processes(workdir, "fit", SPIRAL, *args, *values)
    [straight] = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "fit"
                  and "loopwise.sweep.trial" not in r.data.tags]
    assert_same_training_state(last_of(workdir, "spiral_mlp", straight.info.run_id),
                               last_of(workdir, "spiral_mlp", retry.info.run_id))
