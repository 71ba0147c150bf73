"""Issue 58, point 3: with ``--ckpt_path``, the task (network, optimizer, schedule) comes from the checkpoint and the
trainer from the command; a task value the command gives that the checkpoint replaces is one ``recipes: notice:``
line (it used to be dropped without a word: Lightning's LightningCLI parses the checkpoint's hyperparameters over
the command line). The rule: ``recipes.checkpoints.settings_from_checkpoint``."""

from __future__ import annotations

import torch
from jsonargparse import Namespace

from recipes.checkpoints.settings_from_checkpoint import notice_lines, task_values_replaced
from recipes.cli import main
from tests.conftest import SPIRAL, mlflow_client, runs_of

SHORT = ["--trainer.limit_val_batches", "2"]


def test_only_values_the_command_sets_and_the_checkpoint_replaces_are_named():
    given = Namespace(class_path="T", init_args=Namespace(
        lr_multipliers=None, model=Namespace(class_path="M", init_args=Namespace(hidden_sizes=[64, 64], in_features=None)),
        optimizer=Namespace(class_path="AdamW", init_args=Namespace(lr=0.1, betas=[0.9, 0.999]))))
    saved = Namespace(class_path="T", init_args=Namespace(
        lr_multipliers={"net.0": 0.1}, model=Namespace(class_path="M", init_args=Namespace(hidden_sizes=[128, 128],
                                                                                          in_features=2)),
        optimizer=Namespace(class_path="AdamW", init_args=Namespace(lr=0.01, betas=(0.9, 0.999)))))
    replaced = task_values_replaced(given, saved)
    # None (not set, or linked from the data) is not the user's value; a tuple equals its list
    assert replaced == [("init_args.model.init_args.hidden_sizes", [64, 64], [128, 128]),
                        ("init_args.optimizer.init_args.lr", 0.1, 0.01)]
    lines = notice_lines(replaced, "fit")
    assert len(lines) == 2 and all(line.startswith("recipes: notice: --model.init_args.") for line in lines)
    assert "0.01 is used" in lines[1] and "init_from" in lines[1]
    assert task_values_replaced(given, given) == [] and task_values_replaced(None, saved) == []
    # a size the data module links (its default is not the user's value) is not named
    given.init_args.model.init_args.in_features = 7
    linked = frozenset({"model.init_args.model.init_args.in_features"})
    assert [key for key, _, _ in task_values_replaced(given, saved, linked)] == [
        "init_args.model.init_args.hidden_sizes", "init_args.optimizer.init_args.lr"]


def test_a_resume_keeps_the_checkpoint_s_task_takes_the_command_s_trainer_and_says_what_it_replaced(workdir, capsys):
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "2", *SHORT])
    capsys.readouterr()
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3", *SHORT, "--ckpt_path", "last",
          "--model.init_args.optimizer.init_args.lr", "0.1", "--model.init_args.model.init_args.dropout", "0.5"])
    err = capsys.readouterr().err
    notices = [line for line in err.splitlines() if line.startswith("recipes: notice:")]
    assert len(notices) == 2, err
    assert "optimizer.init_args.lr is 0.1 here but 0.01 in the checkpoint" in notices[0] + notices[1]
    assert "dropout is 0.5 here but 0.0 in the checkpoint" in notices[0] + notices[1]

    (run,) = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "fit"]
    client = mlflow_client(workdir)
    # the command's trainer: 3 epochs (22 steps each); the checkpoint's optimizer: the schedule from lr 0.01
    assert client.get_run(run.info.run_id).data.metrics["epoch"] == 2
    lrs = [m.value for m in client.get_metric_history(run.info.run_id, "lr/decay")]
    assert max(lrs) <= 0.01 + 1e-9
    last = next((workdir / "checkpoints" / "spiral_mlp" / run.info.run_id).glob("last.ckpt"))
    saved = torch.load(last, weights_only=False, map_location="cpu")
    assert saved["epoch"] == 2 and saved["hyper_parameters"]["model"]["init_args"]["dropout"] == 0.0
    assert saved["optimizer_states"][0]["param_groups"][0]["initial_lr"] == 0.01

    capsys.readouterr()  # the same config again: nothing to say
    main(["validate", "-c", str(SPIRAL), *SHORT, "--ckpt_path", "last"])
    assert "recipes: notice:" not in capsys.readouterr().err
