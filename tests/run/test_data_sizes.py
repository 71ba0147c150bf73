"""Sizes come from the data (issue 15, item 4): recipes write no in_features/num_classes/vocab_size, a written size
that disagrees with the data is one line naming both numbers, a task on the wrong kind of data is refused, and a
checkpoint's hyperparameters rebuild its module."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from torch import nn

from lightning_modules import ClassificationModule
from recipes.cli import main
from recipes.run.recipes_cli import RecipesCLI
from recipes.run.data_sizes import SIZE_LINKS
from tests.conftest import CONFIGS, REPO, SPIRAL, runs_of

TABULAR = CONFIGS / "tabular_mlp.yaml"
REGRESSION = CONFIGS / "regression_mlp.yaml"
FAST = ["--trainer.fast_dev_run", "1"]


def nested(config: dict, key: str):
    node = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@pytest.mark.parametrize("recipe", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_recipes_write_no_sizes(recipe):
    config = yaml.safe_load(recipe.read_text())
    written = {link.target: nested(config, link.target) for link in SIZE_LINKS}
    assert {k: v for k, v in written.items() if v is not None} == {}


@pytest.fixture
def data_dir(workdir: Path) -> Path:
    (workdir / "data").symlink_to(REPO / "data")
    return workdir


def first_layer_width(cli: RecipesCLI) -> int:
    """The width the recipe's network (TabM, or any network with ``in_features``) was built for."""
    return cli.model.model.in_features


def test_a_table_with_one_more_column_trains_without_changing_the_recipe(data_dir):
    table = pd.read_csv(REPO / "data" / "churn.csv")
    cli = RecipesCLI(args=["fit", "-c", str(TABULAR), *FAST])
    assert first_layer_width(cli) == cli.datamodule.in_features == 21  # 4 numbers, 3 blocks with <unknown>, <missing>
    table.insert(1, "tenure_days", range(len(table)))  # one more numeric column
    table.to_csv(data_dir / "wider.csv", index=False)
    cli = RecipesCLI(args=["fit", "-c", str(TABULAR), "--data.init_args.path", "wider.csv", *FAST])
    assert first_layer_width(cli) == cli.datamodule.in_features == 22
    assert cli.model.model.numeric_features == cli.datamodule.numeric_features == 5  # embedded one by one
    assert cli.model.num_classes == 2 and cli.model.model.head.out_features == 2


def test_a_binary_classifier_gets_one_output(data_dir):
    cli = RecipesCLI(args=["fit", "-c", str(TABULAR), "--model.init_args.task", "binary", *FAST])
    assert cli.model.num_classes == 2 and cli.model.model.head.out_features == 1


@pytest.mark.parametrize(
    ("recipe", "extra", "message"),
    [
        (TABULAR, ["--model.init_args.model.init_args.in_features", "17"],
         "model.init_args.model.init_args.in_features is 17 in the config, but TabularDataModule has in_features 21: "
         "leave in_features out of the recipe (the data sets it) or make it 21"),
        (TABULAR, ["--model.init_args.model.init_args.out_features", "3"],
         "out_features is 3 in the config, but TabularDataModule has out_features 2"),
        (TABULAR, ["--data.init_args.task", "regression", "--data.init_args.class_balance", "false"],
         "ClassificationModule needs class labels, but TabularDataModule has none (a regression target)"),
        (REGRESSION, ["--data.init_args.path", "data/churn.csv", "--data.init_args.target", "churn",
                      "--data.init_args.task", "classification"],
         "RegressionModule needs numeric targets, but TabularDataModule has 2 classes"),
        (REGRESSION, ["--data.init_args.path", "data/churn.csv", "--data.init_args.target", "churn"],
         "TabularDataModule: task='regression' needs a numeric target, but column 'churn' of 'data/churn.csv' has "
         "'no' at row 0"),
    ],
    ids=["in_features", "out_features", "classifier_on_regression", "regression_on_classes", "data_error"],
)
def test_wrong_sizes_and_kinds_are_one_line_before_any_run(data_dir, capsys, recipe, extra, message):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(recipe), "--trainer.max_epochs", "1", *extra])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err[-1].startswith("recipes: error: ") and message in err[-1]
    assert runs_of(data_dir, recipe.stem) == []  # nothing was made


def test_a_written_size_that_agrees_is_kept(workdir):
    cli = RecipesCLI(args=["fit", "-c", str(SPIRAL), "--model.init_args.model.init_args.in_features", "2", *FAST])
    assert first_layer_width(cli) == 2


class OwnNetwork(nn.Module):
    """A user's network: receives in_features and num_classes by name; ``hidden`` is its own."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 8) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def test_a_users_network_receives_the_sizes_it_names(workdir):
    cli = RecipesCLI(args=["fit", "-c", str(SPIRAL), "--model.init_args.model", f"{__name__}.OwnNetwork", *FAST])
    assert isinstance(cli.model.model, OwnNetwork)
    assert cli.model.model.net[0].in_features == 2 and cli.model.model.net[-1].out_features == 3


class NumericEmbeddingNetwork(OwnNetwork):
    """A network that embeds the leading numeric features: receives numeric_features by name too."""

    def __init__(self, in_features: int, num_classes: int, numeric_features: int = 0) -> None:
        super().__init__(in_features, num_classes)
        self.numeric_features = numeric_features


def test_a_network_that_names_numeric_features_receives_the_tables_count(data_dir):
    network = f"{__name__}.NumericEmbeddingNetwork"
    cli = RecipesCLI(args=["fit", "-c", str(TABULAR), "--model.init_args.model", network, *FAST])
    assert cli.model.model.numeric_features == cli.datamodule.numeric_features == 4


def test_checkpoint_hyperparameters_hold_only_what_the_classes_take(data_dir):
    """Lightning's CLI writes every applied link into the hyperparameters, also in_features for a ConvNet, which
    has none: recipes prunes them, so the checkpoint rebuilds its module with load_from_checkpoint."""
    args = ["fit", "-c", str(CONFIGS / "digits_convnet.yaml"), "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    cli = RecipesCLI(args=args)
    hparams = cli.model.hparams
    assert set(hparams["model"]["init_args"]) >= {"in_channels", "num_classes"}
    assert not {"in_features", "out_features", "vocab_size", "block_size", "max_length"} & set(
        hparams["model"]["init_args"]
    )
    assert not {"vocab_size", "out_features"} & set(hparams)
    best = next((data_dir / "checkpoints" / "digits_convnet").glob("*/best.ckpt"))
    restored = ClassificationModule.load_from_checkpoint(best, weights_only=True)
    assert (restored.model.num_classes, restored.num_classes) == (10, 10)
