"""A sweep closes what it opens (issue 28, part 6): its MLflow parent run ends when its workers do, also when they
are killed (kill -9: the next command on the host closes it), and SIGTERM ends a sweep with 143, as it ends a fit."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from recipes.sweep.heartbeat import retried_trial
from recipes.tracking.abandoned_runs import close_abandoned_runs
from tests.conftest import SPIRAL, recipes_env, runs_of
from tests.sweep_runs import SWEEP, study_of, sweep
from tests.preloaded_python import preloaded_popen

pytestmark = pytest.mark.usefixtures("one_thread")


def start_sweep(workdir, *extra: str) -> subprocess.Popen:
    """A sweep worker in its own process, whose first trial trains for long (400 epochs)."""
    env = {**recipes_env(), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "recipes", "sweep", "-c", str(SPIRAL), "-c", str(SWEEP), "--trainer.max_epochs",
               "400", "--data.init_args.n_samples", "600", "--torch_threads", "1", *extra]
    return preloaded_popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_training(workdir, worker: subprocess.Popen) -> None:
    """Until the worker's first trial has written last.ckpt (it is in its training loop)."""
    deadline = time.monotonic() + 180
    while not list((workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt")):
        assert worker.poll() is None, worker.communicate()
        assert time.monotonic() < deadline, "the trial wrote no last.ckpt"
        time.sleep(0.2)


def parent_and_trial(workdir):
    runs = runs_of(workdir, "spiral_mlp")
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    [trial] = [r for r in runs if r.data.tags.get("loopwise.stage") == "fit"]
    return parent, trial


@pytest.mark.slow
def test_a_killed_workers_parent_run_is_closed_and_the_next_sweep_fails_its_trial_and_goes_on(workdir, capsys):
    worker = start_sweep(workdir, "--n_trials", "1")
    wait_for_training(workdir, worker)
    worker.kill()  # kill -9: nothing of the worker closes anything
    worker.wait(timeout=60)
    parent, trial = parent_and_trial(workdir)
    assert (parent.info.status, trial.info.status) == ("RUNNING", "RUNNING")

    # the next command that opens the experiment on this host (any recipe's prepare_tracking does this)
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    assert set(close_abandoned_runs(uri, "spiral_mlp")) == {parent.info.run_id, trial.info.run_id}
    parent, trial = parent_and_trial(workdir)
    assert (parent.info.status, trial.info.status) == ("KILLED", "KILLED")
    assert "every worker of this sweep" in parent.data.tags["loopwise.abandoned"]

    # the same sweep command again: the dead worker's trial is failed, does not use the budget, the study goes on
    assert study_of(workdir).trials[0].state == TrialState.RUNNING
    assert sweep("--n_trials", "1", "--trainer.max_epochs", "1") == 0
    assert "left RUNNING by a worker that no longer exists" in capsys.readouterr().out
    assert [t.state for t in study_of(workdir).trials] == [TrialState.FAIL, TrialState.COMPLETE]
    runs = runs_of(workdir, "spiral_mlp")
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    assert parent.info.status == "FINISHED"
    assert [r.info.status for r in runs if r.data.tags.get("loopwise.stage") == "fit"] == ["KILLED", "FINISHED"]


@pytest.mark.slow
def test_sigterm_ends_the_sweep_with_143_and_closes_its_trial_and_parent_runs(workdir):
    worker = start_sweep(workdir, "--n_trials", "2")
    wait_for_training(workdir, worker)
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=180)
    assert worker.returncode == 143, err[-3000:]
    assert "recipes sweep: stopped" in err
    parent, trial = parent_and_trial(workdir)
    assert (parent.info.status, trial.info.status) == ("KILLED", "KILLED")
    [interrupted] = study_of(workdir).trials
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["interrupted"] is True


@pytest.mark.parametrize(
    ("workers", "closed"),
    [({"otherhost/12": "running"}, False), ("alive", False), ("dead", True), ({"HOST/1": "ended"}, True)],
    ids=["worker_of_another_host", "live_worker", "dead_worker", "every_worker_ended"],
)
def test_a_parent_run_is_closed_only_when_none_of_its_workers_may_still_work(workdir, workers, closed):
    import socket

    from recipes.tracking.abandoned_runs import WORKER_TAG_PREFIX
    from tests.conftest import mlflow_client

    host = socket.gethostname()
    if workers in ("alive", "dead"):
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        if workers == "dead":
            process.kill()
            process.wait()
        workers = {f"{host}/{process.pid}": "running"}
    client = mlflow_client(workdir)
    experiment = client.create_experiment("spiral_mlp")
    tags = {f"{WORKER_TAG_PREFIX}{key.replace('HOST', host)}": value for key, value in workers.items()}
    parent = client.create_run(experiment, tags={"loopwise.stage": "sweep", **tags}).info.run_id
    try:
        found = close_abandoned_runs(f"sqlite:///{workdir / 'mlflow.db'}", "spiral_mlp")
    finally:
        if "process" in locals() and process.poll() is None:
            process.kill()
    assert found == ([parent] if closed else [])
    assert client.get_run(parent).info.status == ("KILLED" if closed else "RUNNING")


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_worker_killed_mid_trial_leaves_the_record_optunas_and_its_trial_killed_with_its_metrics(
        workdir, monkeypatch, capsys, request, database):
    """Issue 53: one of two workers is killed (kill -9) in the middle of its trial while the other works on. When
    the other ends, without a `recipes sync`: the parent's counts are Optuna's, the dead trial is FAIL in Optuna and
    does not use the budget, and its run is KILLED with every metric its journal holds. Issue 58: the dead trial is
    retried with the same values as a new trial whose run links to the killed one, and the study still reaches
    --n_trials COMPLETE trials; on the study's default SQLite file and on a PostgreSQL server (the team's setup)."""
    import recipes.sweep.runner as runner
    from recipes.tracking.journal import JOURNAL_NAME, read_journal
    from tests.conftest import mlflow_client

    storage = []
    if database == "postgresql":
        storage = ["--storage", request.getfixturevalue("postgres").create_database("optuna_killed_worker")]
    dead = start_sweep(workdir, "--n_trials", "3", *storage)
    wait_for_training(workdir, dead)
    [journal] = (workdir / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}")
    deadline = time.monotonic() + 120
    while not any(e["kind"] == "metrics" and any(k.startswith("val/") for k in e["values"])
                  for e in read_journal(journal)):  # a validation logged: values MLflow may still hold in memory
        assert dead.poll() is None and time.monotonic() < deadline, "the trial logged no validation"
        time.sleep(0.2)
    real = runner.run_trial

    def kill_the_other_then_run(fit_args, active):
        if dead.poll() is None:  # this worker has started, seen the other alive, and asked for its first trial
            dead.kill()
            dead.wait(timeout=60)
        return real(fit_args, active)

    monkeypatch.setattr(runner, "run_trial", kill_the_other_then_run)
    assert sweep("--n_trials", "3", "--trainer.max_epochs", "1", *storage) == 0
    study = study_of(workdir) if not storage else optuna.load_study(study_name="spiral_mlp-sweep", storage=storage[1])
    states = [t.state for t in study.trials]
    assert states == [TrialState.FAIL] + [TrialState.COMPLETE] * 3  # the dead trial does not use the budget
    # trial 1 was asked while trial 0's worker still lived; trial 2 retries trial 0 with its values
    assert retried_trial(study, 2) == 0 and study.trials[2].params == study.trials[0].params
    out = capsys.readouterr().out
    assert "trial(s) 0 were left RUNNING by a worker that no longer exists" in out
    assert "trial 2 retries trial 0 (its worker died) with the same values" in out
    runs = runs_of(workdir, "spiral_mlp")
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    counts = {key: parent.data.metrics[f"trials_{key}"] for key in ("complete", "pruned", "failed", "interrupted")}
    assert counts == {"complete": 3, "pruned": 0, "failed": 0, "interrupted": 1}
    assert counts["failed"] + counts["interrupted"] == states.count(TrialState.FAIL)
    assert parent.info.status == "FINISHED"
    import socket

    assert parent.data.tags[f"loopwise.worker/{socket.gethostname()}/{dead.pid}"] == "died"
    trials = {int(r.data.tags["loopwise.sweep.trial"]): r for r in runs if r.data.tags.get("loopwise.stage") == "fit"}
    killed = trials[0]
    assert killed.info.status == "KILLED" and "loopwise.abandoned" in killed.data.tags
    assert trials[2].data.tags["loopwise.sweep.retry_of_trial"] == "0"
    assert trials[2].data.tags["loopwise.sweep.retry_of_run"] == killed.info.run_id
    assert [trials[n].info.status for n in (1, 2, 3)] == ["FINISHED"] * 3
    client = mlflow_client(workdir)
    journaled = {(key, e["step"]) for e in read_journal(journal) if e["kind"] == "metrics" for key in e["values"]}
    stored = {(key, m.step) for key in killed.data.metrics for m in client.get_metric_history(killed.info.run_id, key)}
    assert journaled and journaled <= stored  # every value the dead worker logged, no sync needed


@pytest.mark.slow
def test_compare_closes_a_sweep_parent_whose_workers_are_all_gone_with_the_studys_counts(workdir, capsys):
    """Issue 53: every worker of a sweep killed (kill -9): `recipes compare` ends the parent run KILLED, its counts
    read from the study (the dead worker's RUNNING trial counted as interrupted), and the trial's run KILLED."""
    from recipes.compare.command import main as compare_main

    assert sweep("--n_trials", "1", "--trainer.max_epochs", "1") == 0  # trial 0 complete
    worker = start_sweep(workdir, "--n_trials", "2")
    deadline = time.monotonic() + 180
    while len(list((workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt"))) < 2:  # trial 1 training
        assert worker.poll() is None and time.monotonic() < deadline, worker.communicate()
        time.sleep(0.2)
    worker.kill()
    worker.wait(timeout=60)
    capsys.readouterr()
    assert compare_main(["--experiment", "spiral_mlp", "--stage", "all", "--format", "csv"]) == 0
    err = capsys.readouterr().err
    runs = runs_of(workdir, "spiral_mlp")
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    assert parent.info.status == "KILLED" and "every worker of this sweep" in parent.data.tags["loopwise.abandoned"]
    counts = {key: parent.data.metrics[f"trials_{key}"] for key in ("complete", "pruned", "failed", "interrupted")}
    assert counts == {"complete": 1, "pruned": 0, "failed": 0, "interrupted": 1}
    assert [r.info.status for r in runs if r.data.tags.get("loopwise.stage") == "fit"] == ["FINISHED", "KILLED"]
    assert f"sweep run {parent.info.run_id}" in err and "1 complete, 1 interrupted (the study's)" in err


def test_compare_closes_a_dead_sweep_parent_with_its_child_runs_counts_when_the_study_cannot_be_read(workdir, capsys):
    """The parent's storage is a URL whose password was masked in its params (or the study is gone): the counts are
    those of its trials' runs."""
    import socket

    from recipes.compare.command import main as compare_main
    from recipes.tracking.abandoned_runs import WORKER_TAG_PREFIX
    from tests.conftest import mlflow_client

    dead = subprocess.Popen(["true"])
    dead.wait()
    client = mlflow_client(workdir)
    experiment = client.create_experiment("spiral_mlp")
    parent = client.create_run(experiment, tags={
        "loopwise.stage": "sweep", "loopwise.sweep.role": "parent", "loopwise.sweep.study": "s",
        f"{WORKER_TAG_PREFIX}{socket.gethostname()}/{dead.pid}": "running"}).info.run_id
    client.log_param(parent, "sweep.storage", "postgresql://team:***@127.0.0.1:1/optuna")
    children = [("FINISHED", {}), ("FINISHED", {}), ("KILLED", {"loopwise.sweep.pruned": "epoch 1: val/acc 0.5"}),
                ("FAILED", {"loopwise.sweep.failure": "ValueError: no"}), ("KILLED", {"loopwise.sweep.failure": "interrupted"})]
    for number, (status, tags) in enumerate(children):
        run = client.create_run(experiment, tags={"loopwise.stage": "fit", "mlflow.parentRunId": parent,
                                                  "loopwise.sweep.study": "s", "loopwise.sweep.trial": str(number), **tags})
        client.log_metric(run.info.run_id, "val/loss", 0.5)
        client.set_terminated(run.info.run_id, status)
    assert compare_main(["--experiment", "spiral_mlp", "--stage", "all", "--format", "csv"]) == 0
    closed = client.get_run(parent)
    assert closed.info.status == "KILLED"
    counts = {key: closed.data.metrics[f"trials_{key}"] for key in ("complete", "pruned", "failed", "interrupted")}
    assert counts == {"complete": 2, "pruned": 1, "failed": 1, "interrupted": 1}
    assert "(its trials' runs)" in capsys.readouterr().err
