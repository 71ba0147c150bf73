"""Bad input to the logged MLflow model (issue 31, point 7): one line in an MlflowException with
INVALID_PARAMETER_VALUE, which `mlflow models serve` answers with HTTP 400 and no traceback."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from recipes.cli import main
from recipes.predict.model_logging import MODEL_TAG
from tests.conftest import CONFIGS, REPO
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


def test_the_model_refuses_a_nan_in_one_line(churn):
    _, model, raw = churn
    assert len(model.predict(raw)) == 3
    message = refusal(lambda: model.predict(with_nan(raw)))  # through MLflow's schema check to the model
    assert message.startswith("loopwise model: bad input: ")
    assert "'monthly_charges'" in message and "NaN" in message and "row 1" in message and "fill or drop" in message


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
def test_mlflow_models_serve_answers_bad_input_with_http_400_and_no_traceback(churn):
    directory, _, raw = churn
    with served_model(directory, "models:/churn/1") as port:
        status, good = invoke(port, raw)
        nan_status, nan = invoke(port, with_nan(raw))
        missing_status, missing = invoke(port, raw.drop(columns=["age"]))
    assert status == 200 and len(good["predictions"]) == 3
    for code, body in ((nan_status, nan), (missing_status, missing)):
        assert code == 400 and body["error_code"] == "INVALID_PARAMETER_VALUE"
        assert "stack_trace" not in body and "Traceback" not in str(body)
    # MLflow's server puts "Failed to predict data '<the rows>'. \nError: " before the model's own line
    nan_line, missing_line = (body["message"].rsplit("\nError: ", 1)[1] for body in (nan, missing))
    for line in (nan_line, missing_line):
        assert line.startswith("loopwise model: bad input: ") and "\n" not in line
    assert "'monthly_charges'" in nan_line and "NaN" in nan_line and "fill or drop" in nan_line
    # the signature's columns are optional: the model's own check names the missing column and the fix
    assert "['age']" in missing_line and "add them" in missing_line


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
