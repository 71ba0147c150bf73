"""``recipes sweep``: trials nested in MLflow, best.yaml, pruning, failures, a continued study, several workers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from recipes.cli import main
from recipes.compare.command import main as compare_main
from tests.conftest import CONFIGS, REPO, SPIRAL, mlflow_client, runs_of
from tests.sweep_runs import SHORT, SWEEP, study_of, sweep
from tests.preloaded_python import preloaded_popen

pytestmark = pytest.mark.usefixtures("one_thread")


def best_of(client, run_id: str, metric: str = "val/acc") -> float:
    return max(m.value for m in client.get_metric_history(run_id, metric))


@pytest.mark.slow
def test_trials_nest_under_one_parent_the_study_continues_and_best_yaml_reproduces_the_best(workdir, capsys):
    assert sweep("--n_trials", "3") == 0
    assert sweep("--n_trials", "4") == 0  # the same command again: one more trial in the same study
    out = capsys.readouterr().out
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 4 and [t.number for t in study.trials] == [0, 1, 2, 3]
    runs = runs_of(workdir, "spiral_mlp")
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("loopwise.stage") == "fit"]
    assert [r.data.tags["mlflow.parentRunId"] for r in trials] == [parent.info.run_id] * 4
    assert sorted(r.data.tags["mlflow.runName"] for r in trials) == [f"spiral_mlp-sweep-trial-{n}" for n in range(4)]
    client = mlflow_client(workdir)
    by_number = {int(r.data.tags["loopwise.sweep.trial"]): r for r in trials}
    for trial in study.trials:
        run = by_number[trial.number]
        sampled = json.loads(run.data.tags["loopwise.sweep.params"])
        assert float(run.data.params["lr"]) == pytest.approx(sampled["model.init_args.optimizer.init_args.lr"])
        assert trial.value == best_of(client, run.info.run_id)  # the objective: the best validation of the trial
        assert run.info.status == "FINISHED" and "config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert parent.data.params["sweep.metric"] == "val/acc" and parent.data.params["sweep.direction"] == "maximize"
    assert parent.data.metrics["trials_complete"] == 4 and parent.data.metrics["best_value"] == study.best_value
    assert parent.data.tags["loopwise.sweep.best_trial"] == str(study.best_trial.number)
    assert any(k.startswith("importance/") for k in parent.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"search_space.json", "best.yaml"} <= artifacts and parent.info.status == "FINISHED"
    assert f"best trial {study.best_trial.number}: val/acc" in out
    # the trials side by side, best first, and the plot
    capsys.readouterr()
    assert compare_main(["--sweep", "spiral_mlp-sweep", "--format", "json", "--plot", str(workdir / "sweep.png")]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["trial"] for r in rows][0] == study.best_trial.number and rows[0]["val/acc"] == study.best_value
    assert [r["val/acc"] for r in rows] == sorted((t.value for t in study.trials), reverse=True)
    assert rows[0]["model.init_args.optimizer.init_args.lr"] == study.best_params["model.init_args.optimizer.init_args.lr"]
    assert {r["state"] for r in rows} == {"COMPLETE"} and (workdir / "sweep.png").stat().st_size > 10_000
    assert compare_main(["--sweep", parent.info.run_id]) == 0 and "COMPLETE" in capsys.readouterr().out
    # the winner, trained again from best.yaml alone, reaches the same objective exactly (CPU, deterministic)
    main(["fit", "-c", str(workdir / "best.yaml")])
    again = runs_of(workdir, "spiral_mlp")[-1]
    assert "mlflow.parentRunId" not in again.data.tags
    assert best_of(client, again.info.run_id) == study.best_value


@pytest.mark.slow
def test_a_pruned_trial_stops_after_its_validation_and_its_run_is_killed(workdir, monkeypatch, capsys):
    import recipes.sweep.study as sweep_study

    monkeypatch.setattr(sweep_study, "make_pruner", lambda name: optuna.pruners.ThresholdPruner(lower=0.999))
    assert sweep("--n_trials", "2") == 1  # nothing completed
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.PRUNED] * 2
    assert all(list(t.intermediate_values) == [0] for t in study.trials)  # stopped after the first validation
    runs = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "fit"]
    assert [r.info.status for r in runs] == ["KILLED", "KILLED"]
    assert all(r.data.tags["loopwise.sweep.pruned"].startswith("epoch 0: val/acc ") for r in runs)
    assert "trial 0: pruned at epoch 0" in capsys.readouterr().out


@pytest.mark.slow
def test_failing_trials_are_recorded_and_the_sweep_goes_on(workdir, capsys):
    space = workdir / "bad.yaml"
    space.write_text(
        "sweep:\n"
        "  model.init_args.model.init_args.hidden_sizes: {type: categorical, choices: [[0]]}\n"  # no such MLP
    )
    assert sweep("--n_trials", "2", sweep_file=space) == 1
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2
    assert "hidden" in study.trials[0].user_attrs["failure"]
    diverging = workdir / "nan.yaml"
    diverging.write_text("sweep:\n  model.init_args.optimizer.init_args.lr: {type: float, low: 1.0e+8, high: 1.0e+9}\n")
    assert sweep("--n_trials", "1", "--study_name", "nan", sweep_file=diverging) == 1
    [failed] = study_of(workdir, "nan").trials
    assert failed.state == TrialState.FAIL and "NonFiniteError" in failed.user_attrs["failure"]
    [run] = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "fit"]
    assert run.info.status == "FAILED" and "NonFiniteError" in run.data.tags["loopwise.sweep.failure"]
    assert "trial 0: failed: NonFiniteError" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("sweep:\n  model.init_args.optimizer.init_args.lr: {type: float, low: 1.0, high: 0.5}\n",
         "low (1.0) must be below high (0.5)"),
        ("sweep:\n  model.init_args.optimizer.init_args.lr: {type: normal, low: 1.0, high: 2.0}\n",
         "type must be one of float, int, categorical"),
        ("sweep:\n  model.init_args.optimizer.init_args.lr: {type: float, low: 0.0, high: 1.0, log: true}\n",
         "log: true needs low > 0"),
        ("sweep:\n  data.init_args.batch_size: {type: int, low: 8, high: 64}\ntrainer: {max_epochs: 3}\n",
         "a sweep file holds only sweep, metric, direction, pruner"),
    ],
    ids=["low_high", "type", "log", "extra_key"],
)
def test_a_bad_sweep_file_is_one_line(workdir, capsys, content, message):
    (workdir / "space.yaml").write_text(content)
    assert sweep("--n_trials", "1", sweep_file=workdir / "space.yaml") == 2
    err = capsys.readouterr().err
    assert "recipes sweep: error:" in err
    assert message in err and not (workdir / "optuna.db").exists()


def test_a_key_the_recipe_does_not_take_stops_the_sweep_before_any_trial(workdir, capsys):
    (workdir / "space.yaml").write_text("sweep:\n  model.init_args.optimizer.init_args.bogus: {type: int, low: 1, high: 2}\n")
    assert sweep("--n_trials", "1", sweep_file=workdir / "space.yaml") == 2
    assert "bogus" in capsys.readouterr().err and not (workdir / "optuna.db").exists()


@pytest.mark.slow
def test_two_workers_share_one_study_and_one_parent_run(workdir):
    command = [sys.executable, "-m", "recipes", "sweep", "-c", str(SPIRAL), "-c", str(SWEEP), *SHORT, "--n_trials", "4"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    workers = [preloaded_popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for _ in range(2)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], "\n----\n".join(outputs)  # a str: pytest shows it whole
    ran = [{int(line.split("trial ")[1].split(":")[0]) for line in out.splitlines() if ": trial " in line}
           for out in outputs]
    assert ran[0].isdisjoint(ran[1]) and ran[0] | ran[1] == {0, 1, 2, 3}
    study = study_of(workdir)
    assert len(study.trials) == 4 and all(t.state == TrialState.COMPLETE for t in study.trials)
    runs = runs_of(workdir, "spiral_mlp")
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    children = [r for r in runs if r.data.tags.get("loopwise.stage") == "fit"]
    assert len(children) == 4 and {r.data.tags["mlflow.parentRunId"] for r in children} == {parent.info.run_id}


def test_ctrl_c_ends_the_trial_and_the_sweep_and_the_same_command_continues(workdir, monkeypatch, capsys):
    import recipes.sweep.runner as runner

    real = runner.run_trial
    monkeypatch.setattr(runner, "run_trial", lambda fit_args, active: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert sweep("--n_trials", "1", "--trainer.max_epochs", "1") == 130
    assert "run the command again to continue the study" in capsys.readouterr().err
    [interrupted] = study_of(workdir).trials
    assert interrupted.state == TrialState.FAIL and interrupted.user_attrs["interrupted"] is True
    [parent] = runs_of(workdir, "spiral_mlp")
    assert parent.info.status == "KILLED"  # the sweep closes its parent run (it stayed RUNNING)
    assert parent.data.tags[f"loopwise.worker/{socket.gethostname()}/{os.getpid()}"] == "ended"
    monkeypatch.setattr(runner, "run_trial", real)
    assert sweep("--n_trials", "1", "--trainer.max_epochs", "1") == 0  # an interrupted trial does not use the budget
    assert [t.state for t in study_of(workdir).trials] == [TrialState.FAIL, TrialState.COMPLETE]
    [parent] = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags["loopwise.stage"] == "sweep"]
    assert parent.info.status == "FINISHED"


@pytest.mark.slow
def test_under_ddp_rank_0_samples_every_process_trains_the_same_values_in_one_run(workdir):
    from tests.conftest import recipes_env
    from tests.preloaded_python import preloaded_run

    command = [sys.executable, "-m", "recipes", "sweep", "-c", str(SPIRAL), "-c", str(SWEEP),
               "-c", str(CONFIGS / "trainer" / "ddp.yaml"), "--trainer.accelerator", "cpu", "--trainer.devices", "2",
               "--trainer.max_epochs", "2", "--data.init_args.n_samples", "600", "--n_trials", "2"]
    # rank 0 forked from the preloaded Python, and rank 1, which Lightning's launcher starts, forked from it too
    out = preloaded_run(command, cwd=workdir, env=recipes_env(), timeout=420)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = out.stdout.splitlines()
    leader = {int(l.split("trial ")[1].split(":")[0]): json.loads(l[l.index("{"):]) for l in lines
              if l.startswith("recipes sweep: trial ")}
    follower = {int(l.split("trial ")[1].split(":")[0]): json.loads(l[l.index("{"):]) for l in lines
                if l.startswith("recipes sweep: rank 1 follows trial ")}
    assert set(leader) == {0, 1} and follower == leader  # rank 1 trained exactly the values rank 0 sampled
    study = study_of(workdir)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    runs = runs_of(workdir, "spiral_mlp")
    children = [r for r in runs if r.data.tags.get("loopwise.stage") == "fit"]
    assert len(children) == 2 and all(r.data.params["plan.devices"] == "2" for r in children)  # one run per trial


def test_the_pruning_decision_of_rank_0_reaches_every_process():
    from types import SimpleNamespace

    from recipes.callbacks.trial_pruning import TrialPruning
    from recipes.sweep.trial import ActiveTrial

    class Strategy:
        def __init__(self, decision):
            self.decision = decision

        def broadcast(self, value, src=0):
            return self.decision  # what rank 0 sent

    follower = TrialPruning(ActiveTrial(None, 0, "s", None, "val/acc", "maximize", {}))
    follower.is_ddp_backend = True
    for decision in (False, True):
        trainer = SimpleNamespace(sanity_checking=False, is_global_zero=False, strategy=Strategy(decision),
                                  should_stop=False, callback_metrics={}, current_epoch=1)
        follower.on_validation_end(trainer, None)
        assert trainer.should_stop is decision and follower.active.values == []  # rank 1 never reads or reports


@pytest.mark.parametrize("sweep_file", sorted((CONFIGS / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_sweep_file_runs_a_trial_of_its_recipe(workdir, sweep_file):
    (workdir / "data").symlink_to(REPO / "data")
    recipe = CONFIGS / f"{sweep_file.stem}.yaml"
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "-c", str(recipe), "-c", str(sweep_file), "--n_trials", "1", "--trainer.max_epochs", "1",
              "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"])
    assert exc.value.code == 0
    [trial] = study_of(workdir, f"{sweep_file.stem}-sweep").trials
    assert trial.state == TrialState.COMPLETE and set(trial.params) == set(
        __import__("yaml").safe_load(sweep_file.read_text())["sweep"])


def test_the_objective_is_the_tasks_monitor_in_its_direction_unless_chosen(workdir):
    from argparse import Namespace as Options

    from recipes.sweep.command import parsed_fit_config
    from recipes.sweep.objective import objective_of
    from recipes.sweep.space import read_sweep_file

    space = read_sweep_file(SWEEP)
    none = Options(metric=None, direction=None)
    spiral = parsed_fit_config(["-c", str(SPIRAL)])
    assert objective_of(spiral, none, space) == ("val/acc", "maximize")
    assert objective_of(spiral, Options(metric="val/loss", direction=None), space) == ("val/loss", "minimize")
    assert objective_of(spiral, Options(metric="val/f1", direction="minimize"), space) == ("val/f1", "minimize")
    (workdir / "data").symlink_to(REPO / "data")
    tabular = parsed_fit_config(["-c", str(CONFIGS / "tabular_mlp.yaml")])
    assert objective_of(tabular, none, space) == ("val/loss", "minimize")  # the recipe monitors val/loss
