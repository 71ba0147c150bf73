"""Records written before `recipes/` moved into concept folders (issue 29, item 7) still load with the current code:
the MLflow model a fit logged (its copy of ``pyfunc_model.py`` imports ``recipes.checkpoint_files`` and
``recipes.predictions``) and the run's ``config.yaml`` (``recipes.tracking.RecipeLogger`` as a class path).

The files in ``tests/data/logged_before_the_move/`` were written by commit cd168e3 with its own code (ORIGIN.md there).
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import pandas as pd
import pytest
import yaml

from recipes.cli import main
from tests.conftest import REPO, runs_of

BEFORE = REPO / "tests" / "data" / "logged_before_the_move"
ROWS = pd.DataFrame({"x": [0.5, -1.0, 0.1, 1.2, -0.3], "y": [0.2, 0.4, -0.9, -0.2, 0.0]})


def test_the_model_logged_before_the_move_imports_the_old_paths():
    code = (BEFORE / "model" / "pyfunc_model.py").read_text()
    assert "from recipes.checkpoint_files import" in code and "from recipes.predictions import" in code


def test_a_model_logged_before_the_move_loads_and_predicts_as_it_did():
    model = mlflow.pyfunc.load_model(str(BEFORE / "model"))
    import recipes.checkpoint_files  # noqa: PLC0415  (the shim the model's code imported: this tree's, not cd168e3's)

    assert Path(recipes.checkpoint_files.__file__).resolve().is_relative_to(REPO)
    predicted = model.predict(ROWS.copy())
    before = pd.read_csv(BEFORE / "predictions_before_the_move.csv")
    assert list(predicted.columns) == list(before.columns) == ["row", "prediction", "prob_0", "prob_1", "prob_2"]
    assert predicted["row"].tolist() == before["row"].tolist()
    assert predicted["prediction"].astype(str).tolist() == before["prediction"].astype(str).tolist()
    for column in ("prob_0", "prob_1", "prob_2"):
        assert predicted[column].tolist() == pytest.approx(before[column].tolist(), abs=1e-6)


def test_a_config_written_before_the_move_parses_and_fits(workdir: Path):
    config = yaml.safe_load((BEFORE / "config.yaml").read_text())
    assert config["trainer"]["logger"]["class_path"] == "recipes.tracking.RecipeLogger"
    main(["fit", "-c", str(BEFORE / "config.yaml"), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
          "--trainer.limit_val_batches", "2", "--mlflow_model", "false"])
    runs = runs_of(workdir, "spiral_mlp")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
