"""Issue 58, point 1: a sweep survives dead workers on any machine. Trials beat in the study's database while they
train (``recipes.sweep.heartbeat``, recorded through the storage's public API since ``recipes sweep`` asks and tells
rather than ``optimize``); a trial whose heartbeats stopped is failed and retried with the same values; ``--n_trials``
counts COMPLETE trials, so failed and pruned ones are made up for, and a sweep whose every trial fails stops."""

from __future__ import annotations

import time

import pytest
from optuna.trial import TrialState

from recipes.sweep.heartbeat import ask, beating, fail_stale_trials, first_beat, retried_trial
from recipes.sweep.study import open_study
from recipes.sweep.workers import claim_trial
from tests.conftest import runs_of
from tests.sweep_runs import study_of, sweep


def a_study(tmp_path, interval: int = 1):
    study, created, rdb = open_study(f"sqlite:///{tmp_path / 'optuna.db'}", "s", "maximize", "none", 0, interval)
    assert created and rdb.get_heartbeat_interval() == interval
    return study, rdb


def a_trial_of_another_machine(study):
    trial = ask(study)
    trial.suggest_float("lr", 1e-4, 1e-1, log=True)
    claim_trial(trial)
    trial.set_user_attr("loopwise.host", "another-machine")  # its pid cannot be checked from here
    return trial


def test_a_trial_whose_heartbeats_stop_is_failed_after_the_grace_period_and_retried_with_its_values(tmp_path):
    study, rdb = a_study(tmp_path)
    dead = a_trial_of_another_machine(study)
    first_beat(study, rdb, dead.number)  # the worker beats once, then dies (its thread with it)
    beat = time.monotonic()
    assert fail_stale_trials(study, rdb) == []  # within the grace period (3 intervals)
    failed: list[int] = []
    while not failed and time.monotonic() - beat < 20:  # (a loaded machine may be late to look)
        time.sleep(0.5)
        failed = fail_stale_trials(study, rdb)
    assert failed == [dead.number] and time.monotonic() - beat >= 3
    states = {t.number: t.state for t in study.get_trials()}
    assert states == {0: TrialState.FAIL, 1: TrialState.WAITING}
    retry = ask(study)  # the next ask of any worker takes the retry first, with the dead trial's values
    assert retry.number == 1 and retried_trial(study, retry.number) == dead.number
    assert retry.suggest_float("lr", 1e-4, 1e-1, log=True) == dead.params["lr"]
    assert retried_trial(study, dead.number) is None


def test_a_trial_that_trains_longer_than_the_grace_period_keeps_beating(tmp_path):
    study, rdb = a_study(tmp_path)
    alive = a_trial_of_another_machine(study)
    with beating(rdb, first_beat(study, rdb, alive.number), alive.number):
        time.sleep(4.5)
        assert fail_stale_trials(study, rdb) == []
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING]


def test_no_heartbeat_interval_means_no_heartbeats(tmp_path):
    study, created, rdb = open_study(f"sqlite:///{tmp_path / 'optuna.db'}", "s", "maximize", "none", 0, None)
    trial = ask(study)
    assert first_beat(study, rdb, trial.number) is None
    with beating(rdb, 0, trial.number):
        pass
    assert rdb.get_heartbeat_interval() is None and fail_stale_trials(study, rdb) == []


def test_n_trials_counts_complete_trials_and_a_failed_trial_is_made_up_for(workdir, monkeypatch, capsys):
    import recipes.sweep.runner as runner

    real, calls = runner.run_trial, []

    def first_fails(fit_args, active):
        calls.append(active.number)
        return (TrialState.FAIL, "boom") if len(calls) == 1 else real(fit_args, active)

    monkeypatch.setattr(runner, "run_trial", first_fails)
    assert sweep("--n_trials", "2", "--trainer.max_epochs", "1") == 0
    assert [t.state for t in study_of(workdir).trials] == [TrialState.FAIL, TrialState.COMPLETE, TrialState.COMPLETE]
    [parent] = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "sweep"]
    assert {k: parent.data.metrics[f"trials_{k}"] for k in ("complete", "failed", "pruned", "interrupted")} == {
        "complete": 2, "failed": 1, "pruned": 0, "interrupted": 0}
    capsys.readouterr()
    assert sweep("--n_trials", "2", "--trainer.max_epochs", "1") == 0  # complete already: nothing more
    assert len(study_of(workdir).trials) == 3


def test_a_sweep_whose_every_trial_fails_stops_after_n_trials_failures(workdir, monkeypatch, capsys):
    import recipes.sweep.runner as runner

    monkeypatch.setattr(runner, "run_trial", lambda fit_args, active: (TrialState.FAIL, "boom"))
    assert sweep("--n_trials", "3", "--trainer.max_epochs", "1") == 1
    assert [t.state for t in study_of(workdir).trials] == [TrialState.FAIL] * 3
    assert "3 trials failed, as many as --n_trials: stopping" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["-1"])
def test_a_negative_heartbeat_interval_is_one_line(workdir, capsys, value):
    assert sweep("--n_trials", "1", "--heartbeat_interval", value) == 2
    assert "--heartbeat_interval must be >= 0 seconds" in capsys.readouterr().err


def test_a_retry_inherits_the_values_but_not_how_the_dead_trial_ended_or_whose_it_was(tmp_path):
    """A retried trial must count as complete when it completes: it carries neither the dead trial's ``interrupted``
    (a preempted trial's) nor its worker's pid and host, which would make it look dead or interrupted too."""
    from recipes.sweep.heartbeat import MAX_RETRY, retry

    study, rdb = a_study(tmp_path)
    dead = a_trial_of_another_machine(study)
    dead.set_user_attr("interrupted", True)
    dead.set_user_attr("kept", "yes")
    frozen = study.trials[0]
    study.tell(dead, state=TrialState.FAIL)
    retry(study, frozen)
    waiting = study.trials[1]
    assert waiting.state == TrialState.WAITING and waiting.params == frozen.params
    assert waiting.user_attrs == {"kept": "yes"}
    for _ in range(MAX_RETRY + 2):  # a trial whose values kill every worker is not retried forever
        last = study.trials[-1]
        retry(study, last)
    assert len(study.trials) == 2 + MAX_RETRY - 1
