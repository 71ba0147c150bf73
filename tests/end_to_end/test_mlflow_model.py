"""The fitted model in MLflow (issue 15, item 6): a pyfunc model of the run with a signature, registered with
--register_model, predicting raw rows exactly as `recipes predict` does, and served by `mlflow models serve`."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
import pytest

from recipes.cli import main
from recipes.predict.model_logging import MODEL_TAG
from tests.conftest import CONFIGS, REPO, SPIRAL, runs_of, working_directory
from tests.served_models import invoke, served_model

TABULAR = CONFIGS / "tabular_mlp.yaml"
SHORT = ["--trainer.max_epochs", "2"]


@pytest.fixture(scope="module")
def registered(clean_workdir):
    """A 2-epoch tabular fit registered as `churn` in the directory's embedded store, and raw rows to predict."""
    with clean_workdir("registered") as directory:
        (directory / "data").symlink_to(REPO / "data")
        main(["fit", "-c", str(TABULAR), *SHORT, "--register_model", "churn"])
    raw = pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn"]).sample(40, random_state=3)
    raw.loc[raw.index[0], "plan"] = "platinum-unseen"  # a category the train split never had: <unknown>
    raw.loc[raw.index[1], "region"] = None  # a missing value
    return directory, raw.reset_index(drop=True)


def recipes_predict(directory: Path, raw: pd.DataFrame, name: str) -> pd.DataFrame:
    raw.to_csv(directory / f"{name}.csv", index=False)
    with working_directory(directory):
        main(["predict", "-c", str(TABULAR), "--ckpt_path", "best", "--data.init_args.predict_path", f"{name}.csv",
              "--predictions_path", f"{name}-out.csv"])
    return pd.read_csv(directory / f"{name}-out.csv", keep_default_na=False)


def test_the_registered_model_predicts_raw_rows_as_recipes_predict(registered):
    directory, raw = registered
    mlflow.set_tracking_uri(f"sqlite:///{directory / 'mlflow.db'}")
    fit = runs_of(directory, "tabular_mlp")[0]
    client = mlflow.MlflowClient()
    (logged,) = client.search_logged_models([fit.info.experiment_id])  # an MLflow 3 logged model of the run (issue 30)
    assert logged.source_run_id == fit.info.run_id and fit.data.tags[MODEL_TAG] == f"models:/{logged.model_id}"
    assert "MLmodel" in {a.path for a in client.list_logged_model_artifacts(logged.model_id)}
    model = mlflow.pyfunc.load_model("models:/churn/1")
    inputs = [c.name for c in model.metadata.signature.inputs.inputs]
    assert inputs == ["tenure_months", "monthly_charges", "support_calls", "age", "plan", "region", "payment"]
    outputs = [c.name for c in model.metadata.signature.outputs.inputs]
    assert outputs == ["row", "prediction", "prob_no", "prob_yes"]
    version = mlflow.MlflowClient().get_model_version("churn", "1")
    assert version.run_id == fit.info.run_id and version.source == f"models:/{logged.model_id}"
    served = model.predict(raw)
    expected = recipes_predict(directory, raw, "new")
    assert list(served.columns) == list(expected.columns) and len(served) == len(raw) == 40
    assert served["row"].tolist() == list(range(40))
    assert served["prediction"].tolist() == expected["prediction"].tolist()
    for column in ("prob_no", "prob_yes"):
        assert served[column].to_numpy() == pytest.approx(expected[column].to_numpy(), abs=1e-6)


def test_without_register_model_the_model_is_logged_not_registered_and_can_be_switched_off(workdir):
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1"])
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--mlflow_model", "false"])
    with_model, without = runs_of(workdir, "spiral_mlp")
    assert MODEL_TAG not in without.data.tags
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    assert mlflow.MlflowClient().search_registered_models() == []
    model = mlflow.pyfunc.load_model(with_model.data.tags[MODEL_TAG])
    points = pd.DataFrame({"x": [0.0, 0.5, -0.7], "y": [0.1, -0.4, 0.8]})
    predicted = model.predict(points)
    assert list(predicted.columns) == ["row", "prediction", "prob_0", "prob_1", "prob_2"]
    assert predicted[["prob_0", "prob_1", "prob_2"]].sum(axis=1).to_numpy() == pytest.approx([1.0] * 3, abs=1e-5)


@pytest.mark.slow
def test_mlflow_models_serve_answers_with_the_same_predictions(registered):
    directory, raw = registered
    with served_model(directory, "models:/churn/1") as port:
        status, answer = invoke(port, raw)
    assert status == 200
    served = pd.DataFrame(answer["predictions"])
    expected = recipes_predict(directory, raw, "served")
    assert served["prediction"].tolist() == expected["prediction"].tolist()
    assert served["prob_yes"].to_numpy() == pytest.approx(expected["prob_yes"].to_numpy(), abs=1e-6)


def test_a_text_model_takes_raw_texts(workdir):
    (workdir / "data").symlink_to(REPO / "data")
    text = CONFIGS / "text_transformer.yaml"
    main(["fit", "-c", str(text), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5",
          "--register_model", "reviews"])
    reviews = pd.DataFrame({"text": ["not bad at all, I loved it", "the plot was dull, but the cast was great",
                                     "a zebra qwxz never seen word", "terrible"]})
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/reviews/1")
    assert [c.name for c in model.metadata.signature.inputs.inputs] == ["text"]
    served = model.predict(reviews)
    reviews.to_csv(workdir / "new_reviews.csv", index=False)
    main(["predict", "-c", str(text), "--ckpt_path", "best", "--data.init_args.predict_path", "new_reviews.csv",
          "--predictions_path", "out.csv"])
    expected = pd.read_csv(workdir / "out.csv")
    assert list(served.columns) == list(expected.columns) == ["row", "prediction", "prob_negative", "prob_neutral",
                                                               "prob_positive"]
    assert served["prediction"].tolist() == expected["prediction"].tolist()
    assert served["prob_positive"].to_numpy() == pytest.approx(expected["prob_positive"].to_numpy(), abs=1e-6)
