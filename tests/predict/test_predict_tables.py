"""`recipes predict` on a new table (issue 15, item 1): every row of the file, in order, with the checkpoint's
encoding; the same numbers as the training pipeline gives the same rows; readable columns; one-line errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from recipes.cli import main
from tests.conftest import CONFIGS, REPO, runs_of, working_directory

TABULAR = CONFIGS / "tabular_mlp.yaml"
REGRESSION = CONFIGS / "regression_mlp.yaml"


@pytest.fixture(scope="module")
def fitted(clean_workdir):
    """2-epoch fits of the tabular and regression recipes in one directory (no MLflow model: not needed here)."""
    with clean_workdir("fitted") as directory:
        (directory / "data").symlink_to(REPO / "data")
        for recipe in (TABULAR, REGRESSION):
            main(["fit", "-c", str(recipe), "--trainer.max_epochs", "2", "--mlflow_model", "false"])
    return directory


def predict(directory: Path, recipe: Path, out: str, *extra: str) -> pd.DataFrame:
    with working_directory(directory):
        main(["predict", "-c", str(recipe), "--ckpt_path", "best", "--predictions_path", out, *extra])
    return pd.read_csv(directory / out)


def test_a_new_table_without_the_target_gives_every_row_in_order_as_the_split_does(fitted):
    split = predict(fitted, TABULAR, "split.csv")
    assert list(split.columns) == ["row", "prediction", "prob_no", "prob_yes"]
    assert len(split) == 450  # the test split: 15% of 3,000 rows
    table = pd.read_csv(REPO / "data" / "churn.csv")
    rows = split["row"].tolist()  # the rows of the file the test split holds
    assert sorted(set(rows)) == sorted(rows) and max(rows) < len(table)
    shuffled = list(reversed(rows))
    table.iloc[shuffled].drop(columns=["churn"]).to_csv(fitted / "new.csv", index=False)
    new = predict(fitted, TABULAR, "new-out.csv", "--data.init_args.predict_path", "new.csv")
    assert new["row"].tolist() == list(range(450))  # the new file's rows, in file order
    by_file_row = split.set_index("row").loc[shuffled].reset_index()
    assert new["prediction"].tolist() == by_file_row["prediction"].tolist()
    for column in ("prob_no", "prob_yes"):
        assert new[column].to_numpy() == pytest.approx(by_file_row[column].to_numpy(), abs=1e-6)
    assert set(new["prediction"]) <= {"no", "yes"}
    assert (new["prob_no"] + new["prob_yes"]).to_numpy() == pytest.approx([1.0] * 450, abs=1e-5)


def test_regression_predictions_are_in_target_units(fitted):
    split = predict(fitted, REGRESSION, "reg-split.csv")
    assert list(split.columns) == ["row", "prediction"]
    table = pd.read_csv(REPO / "data" / "diabetes.csv")
    table.iloc[split["row"]].drop(columns=["progression"]).to_csv(fitted / "patients.csv", index=False)
    new = predict(fitted, REGRESSION, "reg-new.csv", "--data.init_args.predict_path", "patients.csv")
    assert new["prediction"].to_numpy() == pytest.approx(split["prediction"].to_numpy(), abs=1e-4)
    assert 25 <= new["prediction"].mean() <= 350  # disease progression units (25..346), not standardized


def test_a_new_table_without_a_feature_column_is_one_line(fitted, capsys):
    table = pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn", "region"]).head(5)
    table.to_csv(fitted / "no-region.csv", index=False)
    runs_before = len(runs_of(fitted, "tabular_mlp"))
    with pytest.raises(SystemExit) as exc:
        predict(fitted, TABULAR, "never.csv", "--data.init_args.predict_path", "no-region.csv")
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2
    assert err.startswith("recipes: error: ") and "'no-region.csv' lacks the feature column(s) ['region']" in err
    assert not (fitted / "never.csv").exists()
    assert len(runs_of(fitted, "tabular_mlp")) == runs_before  # the file was read before any run was made
