"""The target fits the task (issue 31, point 3): scikit-learn's diabetes table on the tabular classification recipe
stops in one line before any run (instead of training a 214-class classifier), ``many_classes: true`` lets a real
many-class problem through, and a regression on labels is one line too. The shipped and small tables still pass."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_breast_cancer, load_diabetes, load_wine

from datamodules.tabular import TabularDataModule
from datamodules.target_kind import TargetKindError
from recipes.cli import main
from tests.conftest import CONFIGS, REPO, runs_of

TABULAR = CONFIGS / "tabular_mlp.yaml"
REGRESSION = CONFIGS / "regression_mlp.yaml"


def diabetes_csv(directory: Path) -> Path:
    """scikit-learn's bundled diabetes table (442 rows; target: disease progression, 214 distinct integral values)."""
    path = directory / "diabetes_sklearn.csv"
    load_diabetes(as_frame=True).frame.to_csv(path, index=False)
    return path


def error_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return [line for line in capsys.readouterr().err.strip().splitlines() if line.strip()]


@pytest.mark.parametrize("extra", [[], ["--data.init_args.categorical", "[]"]], ids=["as_is", "categorical_emptied"])
def test_diabetes_on_the_classification_recipe_stops_in_one_line(workdir, capsys, extra):
    """The target's kind is checked first, before the recipe's churn columns (categorical) are looked for; with them
    emptied (as a user adapting the recipe does), the old code trained a 214-class classifier."""
    path = diabetes_csv(workdir)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(TABULAR), "--data.init_args.path", str(path), "--data.init_args.target", "target",
              *extra])
    lines = error_lines(capsys)
    assert exc.value.code == 2 and len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("recipes: error: ")
    assert "classification target 'target'" in line and "214 distinct values" in line
    assert "task: regression" in line and "configs/regression_mlp.yaml" in line and "many_classes: true" in line
    assert runs_of(workdir, "tabular_mlp") == []  # no run was made
    assert not (workdir / "checkpoints").exists() or not any((workdir / "checkpoints").rglob("*.ckpt"))


def test_many_classes_lets_a_real_many_class_problem_through(workdir):
    path = diabetes_csv(workdir)
    dm = TabularDataModule(str(path), target="target", many_classes=True)
    dm.setup("fit")
    assert dm.num_classes == 214 and dm.in_features == 10
    with pytest.raises(TargetKindError, match=r"214 distinct values \(more than 50\)"):
        TabularDataModule(str(path), target="target").setup("fit")
    # through the recipe: the override builds a 214-class classifier and trains one step
    main(["fit", "-c", str(TABULAR), "--data.init_args.path", str(path), "--data.init_args.target", "target",
          "--data.init_args.categorical", "[]", "--data.init_args.class_balance", "false",
          "--data.init_args.many_classes", "true", "--trainer.fast_dev_run", "1"])  # no SystemExit: it trained


def test_mostly_unique_integers_are_refused_and_class_labels_are_not(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=60)
    counts = pd.DataFrame({"x": x, "y": np.r_[np.arange(1, 21), np.zeros(40, dtype=int)]})  # 21 values, 20 in one row
    counts.to_csv(tmp_path / "counts.csv", index=False)
    with pytest.raises(TargetKindError, match=r"'y' .* 21 distinct values \(20 of them in one row only\)"):
        TabularDataModule(str(tmp_path / "counts.csv"), target="y").setup("fit")
    # 50 classes of 3 rows each: class labels, accepted
    labels = pd.DataFrame({"x": rng.normal(size=150), "y": np.repeat(np.arange(50), 3)})
    labels.to_csv(tmp_path / "labels.csv", index=False)
    dm = TabularDataModule(str(tmp_path / "labels.csv"), target="y", val_fraction=0.0, test_fraction=0.0)
    dm.setup("fit")
    assert dm.num_classes == 50


@pytest.mark.parametrize(
    ("table", "target", "task", "classes"),
    [
        (lambda: load_wine(as_frame=True).frame, "target", "classification", 3),
        (lambda: load_breast_cancer(as_frame=True).frame, "target", "classification", 2),
        (lambda: pd.read_csv(REPO / "data" / "churn.csv"), "churn", "classification", 2),
        (lambda: pd.read_csv(REPO / "data" / "diabetes.csv"), "progression", "regression", None),
    ],
    ids=["wine", "breast_cancer", "churn", "regression_recipe_data"],
)
def test_shipped_and_small_tables_pass(tmp_path, table, target, task, classes):
    path = tmp_path / "table.csv"
    table().to_csv(path, index=False)
    dm = TabularDataModule(str(path), target=target, task=task)
    dm.setup("fit")
    assert dm.num_classes == classes


def test_a_regression_on_labels_is_one_line(workdir, capsys):
    frame = load_breast_cancer(as_frame=True).frame
    frame["target"] = frame["target"].map({0: "malignant", 1: "benign"})
    frame.to_csv(workdir / "cancer.csv", index=False)
    frame.assign(target=frame["target"] == "benign").to_csv(workdir / "cancer_bool.csv", index=False)
    for name, shown in (("cancer.csv", "'(malignant|benign)'"), ("cancer_bool.csv", "(True|False)")):
        with pytest.raises(SystemExit) as exc:
            main(["fit", "-c", str(REGRESSION), "--data.init_args.path", name, "--data.init_args.target", "target"])
        lines = error_lines(capsys)
        assert exc.value.code == 2 and len(lines) == 1, lines
        assert lines[0].startswith("recipes: error: ")
        pattern = (rf"task='regression' needs a numeric target, but column 'target' of '{name}' has {shown} at row 0 "
                   r"\(2 distinct values: class labels\); use task: classification .*configs/tabular_mlp\.yaml")
        assert re.search(pattern, lines[0]), lines[0]
    assert runs_of(workdir, "regression_mlp") == []
