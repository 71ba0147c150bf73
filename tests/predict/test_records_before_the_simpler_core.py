"""What users keep from loopwise before the simpler core (``tests/data/written_before_the_simpler_core``, written by
commit 7bd1537, ORIGIN.md there) works with the current code: the logged MLflow models load and predict what they
predicted, ``best.ckpt`` validates to the metrics it had, ``last.ckpt`` resumes, and the tracking journal replays into
a store that never saw the run."""

from __future__ import annotations

import json
import shutil

import mlflow.pyfunc
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from recipes.cli import main
from tests.conftest import CONFIGS, REPO, SPIRAL

BEFORE = REPO / "tests" / "data" / "written_before_the_simpler_core"
RUN_IDS = {"classification": "b558de41c143490cb43530f843e701b8", "regression": "29ff2c7c22b94b058b51825ddbdd54b0"}
SPIRAL_ARGS = ["-c", str(SPIRAL), "--data.init_args.n_samples", "600"]
# the recipe these checkpoints were trained with: today's regression recipe names another network (issue 55)
BEFORE_55 = REPO / "tests" / "data" / "configs" / "regression_before_55.yaml"
REGRESSION_ARGS = ["-c", str(CONFIGS / "regression_mlp.yaml"), "-c", str(BEFORE_55),
                   "--data.init_args.path", str(REPO / "data" / "diabetes.csv")]


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_the_logged_model_predicts_what_it_predicted(kind):
    model = mlflow.pyfunc.load_model(str(BEFORE / kind / "model"))
    example = json.loads((BEFORE / kind / "model" / "input_example.json").read_text())
    now = pd.DataFrame(model.predict(pd.DataFrame(example["data"], columns=example["columns"])))
    before = pd.read_csv(BEFORE / kind / "predictions_before.csv", dtype={"prediction": str} if kind ==
                         "classification" else None)  # class names are strings ("0", "1", "2")
    assert list(now.columns) == list(before.columns)
    for column in before.columns:
        if before[column].dtype.kind == "f":
            assert now[column].to_numpy() == pytest.approx(before[column].to_numpy(), rel=1e-5, abs=1e-6), column
        else:
            assert now[column].astype(str).tolist() == before[column].astype(str).tolist(), column


@pytest.mark.parametrize(("kind", "metric", "value"), [
    ("classification", "val/loss", 0.7103108763694763),
    ("regression", "val/rmse", 60.67619705200195),
])
def test_best_ckpt_validates_to_the_metrics_it_had(kind, metric, value, workdir):
    args = SPIRAL_ARGS if kind == "classification" else REGRESSION_ARGS
    main(["validate", *args, "--ckpt_path", str(BEFORE / kind / "best.ckpt")])
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [run.data.metrics[metric] for run in runs] == [pytest.approx(value, rel=1e-6)]


def test_last_ckpt_resumes_from_its_epoch_and_the_journal_replays(workdir):
    shutil.copy(BEFORE / "classification" / "last.ckpt", workdir / "old_last.ckpt")
    main(["fit", *SPIRAL_ARGS, "--trainer.max_epochs", "3", "--ckpt_path", "old_last.ckpt", "--mlflow_model", "false"])
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    [resumed] = client.search_runs([client.get_experiment_by_name("spiral_mlp").experiment_id])
    history = client.get_metric_history(resumed.info.run_id, "val/loss")
    assert len(history) == 1 and resumed.info.status == "FINISHED"  # epochs 1 and 2 were in the checkpoint

    journal_dir = workdir / "checkpoints" / "spiral_mlp" / RUN_IDS["classification"]
    journal_dir.mkdir(parents=True)
    shutil.copy(BEFORE / "classification" / "tracking-journal.jsonl", journal_dir)
    with pytest.raises(SystemExit) as stop:
        main(["sync"])
    assert stop.value.code == 0
    runs = client.search_runs([client.get_experiment_by_name("spiral_mlp").experiment_id])
    [replayed] = [run for run in runs if run.info.run_id != resumed.info.run_id]
    values = [m.value for m in client.get_metric_history(replayed.info.run_id, "val/loss")]
    assert len(values) == 2 and values[-1] == pytest.approx(0.7103108763694763, rel=1e-6)


@pytest.mark.slow  # a real `mlflow models serve` (about 20 s to start)
def test_the_logged_regression_model_serves_what_it_predicted(tmp_path):
    from tests.served_models import invoke, served_model

    model = BEFORE / "regression" / "model"
    example = json.loads((model / "input_example.json").read_text())
    before = pd.read_csv(BEFORE / "regression" / "predictions_before.csv")
    with served_model(tmp_path, str(model)) as port:
        status, body = invoke(port, pd.DataFrame(example["data"], columns=example["columns"]))
    assert status == 200, body
    served = [row["prediction"] for row in body["predictions"]]
    assert served == pytest.approx(before["prediction"].tolist(), rel=1e-5)
