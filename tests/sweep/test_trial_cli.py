"""``TrialCLI``: a sweep trial's fit gets the trial's tags and pruning callback through ``RecipesCLI``'s extension
points; a plain ``RecipesCLI`` fit in the same process afterwards gets neither (the general command knows no trial)."""

from __future__ import annotations

import optuna
from mlflow.tracking import MlflowClient

from recipes.callbacks.epoch_summary import EpochSummary
from recipes.callbacks.callback_group import CallbackGroup
from recipes.run.callback_table import flat
from recipes.run.recipes_cli import RecipesCLI
from recipes.callbacks.trial_pruning import TrialPruning
from recipes.sweep.trial import ActiveTrial
from recipes.sweep.trial_cli import TrialCLI
from tests.conftest import SPIRAL, mlflow_client, runs_of

SHORT = ["--trainer.max_epochs", "2", "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
         "--data.init_args.n_samples", "300", "--mlflow_model=false"]


def test_a_trials_fit_gets_its_tags_and_pruning_callback_and_a_plain_fit_after_it_neither(workdir):
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.create_experiment("spiral_mlp")
    parent = client.create_run(experiment, run_name="sweep s").info.run_id
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    active = ActiveTrial(trial, trial.number, "s", parent, "val/acc", "maximize", {"data.init_args.batch_size": 32})

    cli = TrialCLI(active, args=["fit", "-c", str(SPIRAL), *SHORT, "--trainer.logger.init_args.run_name=s-trial-0"])
    pruning = [c for c in flat(cli.trainer.callbacks) if isinstance(c, TrialPruning)]
    assert len(pruning) == 1 and pruning[0].active is active
    [group] = [c for c in cli.trainer.callbacks if isinstance(c, CallbackGroup)]
    # where the table's sweep row stood: after the epoch summary, before the loop doctor (the group's last member
    # since issue 32)
    assert group.members[-2] is pruning[0] and isinstance(group.members[-3], EpochSummary)
    assert type(group.members[-1]).__name__ == "LoopDoctor"
    assert len(active.values) == 2 and active.best_value() == max(active.values)  # reported after each validation
    assert list(study.trials[0].intermediate_values) == [0, 1]

    plain = RecipesCLI(args=["fit", "-c", str(SPIRAL), *SHORT])
    assert not [c for c in flat(plain.trainer.callbacks) if isinstance(c, TrialPruning)]
    assert plain.extra_run_tags() == {} and plain.extra_callbacks() == []
    assert len(active.values) == 2  # the plain fit reported nothing to the trial

    trial_run, plain_run = [r for r in runs_of(workdir, "spiral_mlp") if r.info.run_id != parent]
    assert trial_run.data.tags["mlflow.parentRunId"] == parent
    assert trial_run.data.tags["loopwise.sweep.study"] == "s" and trial_run.data.tags["loopwise.sweep.trial"] == "0"
    assert trial_run.data.tags["loopwise.sweep.params"] == '{"data.init_args.batch_size": 32}'
    assert not [k for k in plain_run.data.tags if k.startswith("loopwise.sweep.") or k == "mlflow.parentRunId"]
    assert mlflow_client(workdir).get_run(plain_run.info.run_id).info.status == "FINISHED"
