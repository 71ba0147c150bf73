"""Bad input to the logged MLflow model (issue 31, point 7): one line in an MlflowException with
INVALID_PARAMETER_VALUE, which `mlflow models serve` answers with HTTP 400 and no traceback. Issue 53: the line names
every bad row and column (a boolean in a numeric column is not a number, also after MLflow's JSON parsing), and a
category the model was not trained on is predicted with the column's `<unknown>` slot and named in the response's
`unknown_categories` column, as in the CSV of `recipes predict`. Issue 55: a missing value (NaN, JSON null) is
predicted (`missing: impute`, the default: the train median, a category's `<missing>` slot) with the numbers
`frame_data` and the task give in Python; a model trained with `missing: error` refuses a missing number in one
line."""

from __future__ import annotations

import json
import warnings

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException

from datamodules.tabular import TabularDataModule
from lightning_modules import ClassificationModule

from recipes.cli import main
from recipes.predict.model_logging import MODEL_TAG
from tests.conftest import CONFIGS, REPO, working_directory
from tests.served_models import invoke, served_model

TABULAR = CONFIGS / "tabular_mlp.yaml"


@pytest.fixture(scope="module")
def churn(clean_workdir):
    """A 1-epoch tabular fit registered as `churn`, its loaded pyfunc model, and 3 good raw rows."""
    with clean_workdir("served_input") as directory:
        (directory / "data").symlink_to(REPO / "data")
        main(["fit", "-c", str(TABULAR), "--trainer.max_epochs", "1", "--register_model", "churn"])
    mlflow.set_tracking_uri(f"sqlite:///{directory / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/churn/1")
    raw = pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn"]).head(3)
    return directory, model, raw


@pytest.fixture(scope="module")
def strict_churn(clean_workdir):
    """A 1-epoch tabular fit with `missing: error` (the encoding before missing values were taken), its loaded pyfunc
    model and 3 good raw rows."""
    with clean_workdir("served_input_strict") as directory:
        (directory / "data").symlink_to(REPO / "data")
        main(["fit", "-c", str(TABULAR), "--trainer.max_epochs", "1", "--data.init_args.missing", "error",
              "--register_model", "strict_churn"])
    mlflow.set_tracking_uri(f"sqlite:///{directory / 'mlflow.db'}")
    model = mlflow.pyfunc.load_model("models:/strict_churn/1")
    raw = pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn"]).head(3)
    return directory, model, raw


@pytest.fixture(scope="module")
def churn_server(churn):
    """`mlflow models serve` of the `churn` model, started once for the module's tests of the real server."""
    directory, _, _ = churn
    with served_model(directory, "models:/churn/1") as port:
        yield port


def with_nan(raw: pd.DataFrame) -> pd.DataFrame:
    bad = raw.copy()
    bad.loc[1, "monthly_charges"] = np.nan  # a float column the training table had no NaN in
    return bad


def refusal(call) -> str:
    with pytest.raises(MlflowException) as caught:
        call()
    assert caught.value.error_code == "INVALID_PARAMETER_VALUE" and caught.value.get_http_status_code() == 400
    assert "\n" not in caught.value.message
    return caught.value.message


def with_text(raw: pd.DataFrame) -> pd.DataFrame:
    bad = raw.astype({"monthly_charges": object})
    bad.loc[1, "monthly_charges"] = "cheap"
    return bad


def test_a_model_trained_with_missing_error_refuses_a_nan_in_one_line(strict_churn):
    _, model, raw = strict_churn
    assert len(model.predict(raw)) == 3
    message = refusal(lambda: model.predict(with_nan(raw)))  # through MLflow's schema check to the model
    assert message.startswith("loopwise model: bad input: ")
    assert "'monthly_charges'" in message and "NaN" in message and "row 1" in message and "fill or drop" in message
    assert "missing: error" in message and "add the column to categorical" not in message


def with_missing_values() -> pd.DataFrame:
    """Six raw rows with missing numbers and categories (the float column: MLflow's schema check refuses a NaN in
    an integer column of the signature before the model sees it)."""
    rows = pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn"]).head(6)
    rows.loc[1, "monthly_charges"] = np.nan
    rows.loc[2, "region"] = None
    rows.loc[3, ["monthly_charges", "plan"]] = [np.nan, None]
    rows.loc[4, "payment"] = None
    return rows


def probabilities_in_python(directory, rows: pd.DataFrame) -> np.ndarray:
    """P(no), P(yes) of raw rows from the fit's best.ckpt: the task and ``TabularDataModule.frame_data``, no MLflow."""
    [checkpoint] = sorted((directory / "checkpoints").rglob("best.ckpt"))  # the fit's own (mlruns holds a copy)
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    task = ClassificationModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True).eval()
    settings = {k: v for k, v in saved["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    datamodule = TabularDataModule(**settings)
    datamodule.load_state_dict(saved["TabularDataModule"])
    dataset, _ = datamodule.frame_data(rows)
    with torch.no_grad():
        return task.predict_step((dataset.tensors[0],), 0).numpy()


def test_the_model_predicts_missing_values_as_frame_data_and_the_task_do_in_python(churn):
    directory, model, _ = churn
    rows = with_missing_values()
    predicted = model.predict(rows)
    assert len(predicted) == 6 and "unknown_categories" not in predicted.columns  # a missing value is not unknown
    expected = probabilities_in_python(directory, rows)
    assert predicted[["prob_no", "prob_yes"]].to_numpy() == pytest.approx(expected, abs=1e-6)
    clean = model.predict(pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn"]).head(6))
    for row in (1, 2, 3, 4):  # each missing value changed the row's prediction
        assert clean["prob_yes"][row] != pytest.approx(predicted["prob_yes"][row], abs=1e-6)
    assert clean["prob_yes"][5] == pytest.approx(predicted["prob_yes"][5], abs=1e-7)


@pytest.mark.slow
def test_mlflow_models_serve_predicts_missing_values_as_python_does(churn, churn_server):
    directory, _, _ = churn
    rows = with_missing_values()
    status, body = invoke(churn_server, rows)  # JSON null for the missing values
    assert status == 200, body
    served = np.array([[row["prob_no"], row["prob_yes"]] for row in body["predictions"]])
    assert served == pytest.approx(probabilities_in_python(directory, rows), abs=1e-6)
    assert all("unknown_categories" not in row for row in body["predictions"])


def test_the_model_refuses_a_missing_column_and_a_text_in_a_number_column_in_one_line(churn):
    _, model, raw = churn
    assert [c.required for c in model.metadata.signature.inputs.inputs] == [False] * 7  # our check, not MLflow's
    message = refusal(lambda: model.predict(raw.drop(columns=["age"])))
    assert "['age']" in message and "add them" in message
    words = raw.astype({"monthly_charges": object})
    words.loc[2, "monthly_charges"] = "cheap"
    message = refusal(lambda: model.unwrap_python_model().predict(None, words))  # MLflow's schema refuses it first
    assert "'monthly_charges'" in message and "'cheap'" in message and "row 2" in message


@pytest.mark.slow
def test_mlflow_models_serve_answers_bad_input_with_http_400_and_no_traceback(churn, churn_server):
    _, _, raw = churn
    port = churn_server  # started once for the module (the issue 53 test below asks the same server)
    status, good = invoke(port, raw)
    nan_status, _ = invoke(port, with_nan(raw))  # missing: impute (the default) predicts it
    text_status, text = invoke(port, with_text(raw))
    missing_status, missing = invoke(port, raw.drop(columns=["age"]))
    assert status == 200 and len(good["predictions"]) == 3 and nan_status == 200
    for code, body in ((text_status, text), (missing_status, missing)):
        assert code == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "stack_trace" not in body and "Traceback" not in str(body)
    # MLflow's server puts "Failed to predict data '<the rows>'. \nError: " before the model's own line
    text_line, missing_line = (body["message"].rsplit("\nError: ", 1)[1] for body in (text, missing))
    for line in (text_line, missing_line):
        assert line.startswith("loopwise model: bad input: ") and "\n" not in line
    assert "'monthly_charges'" in text_line and "'cheap'" in text_line and "fill or drop" in text_line
    # the signature's columns are optional: the model's own check names the missing column and the fix
    assert "['age']" in missing_line and "add them" in missing_line



# --- issue 53: every bad row and column named, unseen and missing categories said so ------------------------------
def six_rows() -> pd.DataFrame:
    return pd.read_csv(REPO / "data" / "churn.csv").drop(columns=["churn"]).head(6)


def with_bad_cells() -> pd.DataFrame:
    """Six raw rows, three of them with a value no numeric column takes (as MLflow parses JSON `true`), one with a
    missing number (JSON `null`), which the model imputes."""
    bad = six_rows().astype({"tenure_months": object, "monthly_charges": object, "support_calls": object})
    bad.loc[1, "tenure_months"] = True  # an integer column
    bad.loc[2, "age"] = None  # a missing number: imputed (missing: impute)
    bad.loc[3, "support_calls"] = False
    bad.loc[4, "monthly_charges"] = "cheap"
    return bad


def with_unknown_categories() -> pd.DataFrame:
    rows = six_rows()
    rows.loc[1, "plan"] = "gold"  # the train split has basic, premium, ...: never gold
    rows.loc[2, "region"] = None  # a missing category: its own <missing> slot, not unknown
    rows.loc[3, ["plan", "payment"]] = ["gold", "crypto"]
    return rows


UNKNOWN_NOTES = ["", "plan='gold'", "", "plan='gold'; payment='crypto'", "", ""]


def assert_names_every_bad_cell(line: str) -> None:
    assert "\n" not in line and line.startswith("loopwise model: bad input: TabularDataModule: 3 value(s) ")
    for cell in ("row 1, column 'tenure_months': true is not a number",
                 "row 3, column 'support_calls': false is not a number",
                 "row 4, column 'monthly_charges': 'cheap' is not a number"):
        assert cell in line
    assert "row 0" not in line and "row 2" not in line and "row 5" not in line  # row 2's missing age is imputed


def test_the_model_names_every_bad_row_and_column_and_refuses_a_boolean_as_a_number(churn):
    _, model, _ = churn
    assert_names_every_bad_cell(refusal(lambda: model.predict(with_bad_cells())))
    # the scoring server's own parsing of a JSON body (it casts columns to the signature's types before predict)
    from mlflow.pyfunc.scoring_server import invocations

    body = json.dumps({"dataframe_split": json.loads(with_bad_cells().to_json(orient="split", index=False))})
    with pytest.raises(MlflowException) as caught:
        invocations(body, "application/json", model, model.metadata.get_input_schema())
    assert caught.value.get_http_status_code() == 400
    assert_names_every_bad_cell(caught.value.message.rsplit("\nError: ", 1)[1])


def test_an_unseen_category_is_predicted_with_the_unknown_slot_and_named_as_recipes_predict_does(churn):
    directory, model, _ = churn
    rows = with_unknown_categories()
    predicted = model.predict(rows)
    assert list(predicted.columns) == ["row", "prediction", "prob_no", "prob_yes", "unknown_categories"]
    assert predicted["unknown_categories"].tolist() == UNKNOWN_NOTES
    # the <unknown> slot: any other unseen value gives the same numbers; a missing one has a slot of its own
    other = rows.copy()
    other.loc[1, "plan"], other.loc[3, ["plan", "payment"]] = "platinum", ["x", "y"]
    assert model.predict(other)["prob_yes"].to_numpy() == pytest.approx(predicted["prob_yes"].to_numpy(), abs=1e-7)
    other.loc[2, "region"] = "atlantis"
    assert model.predict(other)["prob_yes"][2] != pytest.approx(predicted["prob_yes"][2], abs=1e-6)
    clean = model.predict(six_rows())
    assert list(clean.columns) == ["row", "prediction", "prob_no", "prob_yes"]  # nothing unknown: no such column
    assert clean["prob_yes"].tolist()[4:] == predicted["prob_yes"].tolist()[4:]
    assert clean["prob_yes"][2] != pytest.approx(predicted["prob_yes"][2], abs=1e-6)  # <missing>, not region's value
    assert clean["prob_yes"][1] != pytest.approx(predicted["prob_yes"][1], abs=1e-4)
    # recipes predict: the same column in its CSV and one warning (a `recipes: warning:` line on the terminal)
    rows.to_csv(directory / "unknown.csv", index=False)
    with working_directory(directory), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["predict", "-c", str(TABULAR), "--ckpt_path", "best", "--data.init_args.predict_path", "unknown.csv",
              "--predictions_path", "unknown-out.csv"])
    written = pd.read_csv(directory / "unknown-out.csv", keep_default_na=False)
    assert written["unknown_categories"].tolist() == UNKNOWN_NOTES
    assert written["prob_yes"].to_numpy() == pytest.approx(predicted["prob_yes"].to_numpy(), abs=1e-6)
    assert [str(w.message) for w in caught if "unknown_categories" in str(w.message)] == [
        "TabularDataModule: 2 of 6 row(s) of 'unknown.csv' have a category the model was not "
        "trained on, predicted with the column's <unknown> slot (first: row 1, plan='gold'); the "
        "predictions name them in the column unknown_categories"
    ]


@pytest.mark.slow
def test_the_served_model_names_every_bad_row_in_one_400_and_says_which_categories_were_unknown(churn_server):
    status, body = invoke(churn_server, with_bad_cells())  # JSON true and null, as a client sends them
    assert status == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE" and "stack_trace" not in body
    assert_names_every_bad_cell(body["message"].rsplit("\nError: ", 1)[1])
    status, body = invoke(churn_server, with_unknown_categories())
    assert status == 200
    assert [row["unknown_categories"] for row in body["predictions"]] == UNKNOWN_NOTES


IMAGE_RECIPE = """\
seed_everything: 0
trainer:
  max_epochs: 1
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    model:
      class_path: lightning_modules.models.MLP
      init_args:
        hidden_sizes: [8]
data:
  class_path: datamodules.ImageFolderDataModule
  init_args:
    root: shapes
    image_size: [4, 4]
    batch_size: 4
    val_fraction: 0.25
"""


def test_an_image_model_refuses_an_unreadable_image_path_in_one_line(workdir):
    from PIL import Image

    for colour, rgb in {"red": (200, 40, 40), "blue": (40, 40, 200)}.items():
        (workdir / "shapes" / colour).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (5, 5), rgb).save(workdir / "shapes" / colour / f"{i}.png")
    (workdir / "images.yaml").write_text(IMAGE_RECIPE)
    main(["fit", "-c", str(workdir / "images.yaml")])
    mlflow.set_tracking_uri(f"sqlite:///{workdir / 'mlflow.db'}")
    (run,) = mlflow.search_runs(experiment_names=["images"], output_format="list")
    model = mlflow.pyfunc.load_model(run.data.tags[MODEL_TAG])
    good = str(workdir / "shapes" / "red" / "0.png")
    assert model.predict(pd.DataFrame({"path": [good]}))["prediction"].tolist() == ["red"]
    (workdir / "notes.png").write_text("not an image")
    for bad in ("notes.png", "nowhere.png"):
        message = refusal(lambda: model.predict(pd.DataFrame({"path": [good, str(workdir / bad)]})))
        assert message.startswith("loopwise model: bad input: ImageFolderDataModule: ") and bad in message
