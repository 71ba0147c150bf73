"""Run names and descriptions that say something (issue 20, part 5): ``<experiment>-<short run id>``, and the
command-line overrides as the run's description and the ``loopwise.overrides`` tag."""

from __future__ import annotations

from recipes.cli import main
from recipes.run.description import describe_command, split_command_line
from tests.conftest import SPIRAL, runs_of


def test_the_command_line_is_split_into_config_files_and_overrides():
    configs, overrides = split_command_line(
        ["fit", "-c", "configs/spiral_mlp.yaml", "--config=configs/trainer/ddp.yaml", "--model.init_args.lr",
         "0.003", "--trainer.max_epochs=5", "--trainer.enable_progress_bar"]
    )
    assert configs == ["configs/spiral_mlp.yaml", "configs/trainer/ddp.yaml"]
    assert overrides == [("model.init_args.lr", "0.003"), ("trainer.max_epochs", "5"),
                         ("trainer.enable_progress_bar", "true")]
    tags = describe_command("fit", ["-c", "a.yaml", "--model.init_args.model.init_args.hidden_sizes", "[64]"])
    assert tags == {
        "loopwise.overrides": "--model.init_args.model.init_args.hidden_sizes=[64]",
        "mlflow.note.content": "recipes fit -c a.yaml; overrides: model.model.hidden_sizes=[64]",
    }
    assert describe_command("test", ["test", "-c", "a.yaml"])["mlflow.note.content"] == "recipes test -c a.yaml; no overrides"


def test_runs_are_named_after_their_id_and_described_by_their_overrides(workdir):
    common = ["-c", str(SPIRAL), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
              "--mlflow_model", "false", "--system_metrics_interval", "0"]
    main(["fit", *common, "--model.init_args.optimizer.init_args.lr=0.003"])
    main(["test", *common, "--ckpt_path", "last"])
    fit, test = runs_of(workdir, "spiral_mlp")
    for run in (fit, test):
        assert run.info.run_name == f"spiral_mlp-{run.info.run_id[:8]}"
        assert run.data.tags["mlflow.runName"] == run.info.run_name
    assert fit.data.tags["loopwise.overrides"] == (
        "--trainer.max_epochs=1 --trainer.limit_train_batches=2 --mlflow_model=false --system_metrics_interval=0 "
        "--model.init_args.optimizer.init_args.lr=0.003"
    )
    assert fit.data.tags["mlflow.note.content"] == (
        f"recipes fit -c {SPIRAL}; overrides: trainer.max_epochs=1, trainer.limit_train_batches=2, "
        "mlflow_model=false, system_metrics_interval=0, model.optimizer.lr=0.003"
    )
    assert test.data.tags["mlflow.note.content"].endswith("system_metrics_interval=0, ckpt_path=last")
    assert test.data.tags["loopwise.fit_run_name"] == fit.info.run_name
