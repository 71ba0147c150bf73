"""Issue 55, item 1-2: the shipped tabular recipes run on a table nobody wrote them for, given only `path` and
`target`: other column names, integer, float and text columns, missing values in numeric and categorical columns;
`recipes predict` scores new rows with missing values with the same command shape, and the logged MLflow model gives
the same numbers."""

from __future__ import annotations

import math
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest

from recipes.cli import main
from tests.conftest import CONFIGS, working_directory

TABULAR = CONFIGS / "tabular_mlp.yaml"
REGRESSION = CONFIGS / "regression_mlp.yaml"


def a_table(rows: int, seed: int) -> pd.DataFrame:
    """A table unlike churn: an integer count, two floats (one with 10% missing), a text column with missing values,
    a class label that depends on them and a numeric target."""
    rng = np.random.default_rng(seed)
    visits = rng.poisson(3, rows)
    spend = rng.lognormal(3, 1, rows)
    score = rng.normal(size=rows)
    colour = rng.choice(["red", "green", "blue"], rows).astype(object)
    signal = 0.6 * visits + np.log(spend) - (colour == "red") * 2 + score
    spend[rng.random(rows) < 0.1] = np.nan
    colour[rng.random(rows) < 0.1] = None
    return pd.DataFrame({
        "visits": visits, "spend": spend, "score": score, "colour": colour,
        "bought": np.where(signal > np.median(signal), "yes", "no"), "amount": signal * 10 + rng.normal(size=rows),
    })


@pytest.fixture(scope="module")
def fitted(clean_workdir):
    """Both recipes fitted (3 epochs) on the generated table, given only its path and target."""
    with clean_workdir("any_table") as directory:
        a_table(600, 0).drop(columns=["amount"]).to_csv(directory / "shop.csv", index=False)
        a_table(600, 0).drop(columns=["bought"]).to_parquet(directory / "shop_amounts.parquet")
        main(["fit", "-c", str(TABULAR), "--data.init_args.path", "shop.csv", "--data.init_args.target", "bought",
              "--trainer.max_epochs", "3"])
        main(["fit", "-c", str(REGRESSION), "--data.init_args.path", "shop_amounts.parquet",
              "--data.init_args.target", "amount", "--trainer.max_epochs", "3", "--mlflow_model", "false"])
    return directory


def predict(directory: Path, recipe: Path, path: str, target: str, new: str, out: str) -> pd.DataFrame:
    with working_directory(directory):
        main(["predict", "-c", str(recipe), "--data.init_args.path", path, "--data.init_args.target", target,
              "--ckpt_path", "best", "--data.init_args.predict_path", new, "--predictions_path", out])
    return pd.read_csv(directory / out)


def test_a_new_table_with_missing_values_trains_on_path_and_target_alone_and_predicts_them(fitted):
    new = a_table(40, 1).drop(columns=["bought", "amount"])
    new.loc[0, "spend"], new.loc[1, "colour"], new.loc[2, "score"] = np.nan, None, np.nan  # score: none in training
    new.to_csv(fitted / "new.csv", index=False)
    scores = predict(fitted, TABULAR, "shop.csv", "bought", "new.csv", "scores.csv")
    assert list(scores.columns) == ["row", "prediction", "prob_no", "prob_yes"] and len(scores) == 40
    assert np.isfinite(scores[["prob_no", "prob_yes"]].to_numpy()).all()
    assert (scores["prob_no"] + scores["prob_yes"]).to_numpy() == pytest.approx(np.ones(40), abs=1e-5)
    # the logged MLflow model imputes the same way: the same probabilities for the same raw rows
    mlflow.set_tracking_uri(f"sqlite:///{fitted / 'mlflow.db'}")
    [run] = mlflow.search_runs(search_all_experiments=True, filter_string="tags.`loopwise.stage` = 'fit'",
                               output_format="list", order_by=["attributes.start_time ASC"])[:1]
    model = mlflow.pyfunc.load_model(run.data.tags["loopwise.model_uri"])
    served = model.predict(pd.read_csv(fitted / "new.csv"))
    assert served["prob_yes"].to_numpy() == pytest.approx(scores["prob_yes"].to_numpy(), abs=1e-5)


def test_the_encoding_infers_the_columns_and_imputes_with_the_train_split(fitted):
    from datamodules import TabularDataModule

    data = TabularDataModule(path=str(fitted / "shop.csv"), target="bought", missing="impute", scaling="quantile")
    data.setup()
    assert data.numeric_columns == ["visits", "spend", "score"] and data.categorical_columns == ["colour"]
    assert data.numeric_features == 3
    assert data.feature_names[3] == "spend=<missing>"  # spend had missing train values, score none
    assert data.feature_names[4:6] == ["colour=<unknown>", "colour=<missing>"]
    train = pd.read_csv(fitted / "shop.csv").iloc[data.split_rows["train"].numpy()]
    assert data.encoder.state_dict()["numeric_fill"][1] == pytest.approx(float(train["spend"].median()))


def test_the_regression_recipe_runs_on_a_parquet_table_and_predicts_in_target_units(fitted):
    new = a_table(30, 2).drop(columns=["bought", "amount"])
    new.loc[0, "spend"] = np.nan
    new.to_parquet(fitted / "new.parquet")
    out = predict(fitted, REGRESSION, "shop_amounts.parquet", "amount", "new.parquet", "amounts.csv")
    assert len(out) == 30 and all(math.isfinite(v) for v in out["prediction"])
    table = a_table(600, 0)
    assert table["amount"].min() - 20 < out["prediction"].mean() < table["amount"].max() + 20  # target units
