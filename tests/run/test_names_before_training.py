"""Names that would fail after a run exists are refused before it (issue 28, part 8): a registered model name MLflow
refuses (it used to fail after the whole training, the run FAILED) and an experiment name longer than the file system
allows (it used to be a ``File name too long`` traceback with the run left RUNNING)."""

from __future__ import annotations

import pytest

from recipes.cli import main
from recipes.predict.model_logging import check_registered_model_name
from recipes.tracking.config import longest_experiment_name
from tests.conftest import SPIRAL, runs_of

QUICK = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]


def refused(capsys, args: list[str]) -> str:
    """The one error line of a command that must stop with exit 2."""
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("recipes: error: "), lines
    return lines[-1]


@pytest.mark.parametrize(
    ("name", "reason"),
    [("bad/name", "it contains '/' or ':'"), ("", "it is empty"), ("a:b", "it contains '/' or ':'"),
     ("..up", "MLflow refuses '.'"), ("m" * 257, "257 characters long")],
    ids=["slash", "empty", "colon", "dotdot", "too_long"],
)
def test_a_registered_model_name_mlflow_refuses_stops_the_fit_before_any_run(workdir, capsys, name, reason):
    line = refused(capsys, ["fit", "-c", str(SPIRAL), *QUICK, "--register_model", name])
    assert "is not a name the MLflow Model Registry accepts" in line and reason in line
    assert runs_of(workdir, "spiral_mlp") == [] and not (workdir / "checkpoints").exists()


def test_the_registered_model_name_rule_is_mlflows():
    """The same names refused as MLflow's own check refuses them (it runs only when a model is registered)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name  # the rule itself, only to compare with it

    for name in ["churn", "spiral-mlp_v2", "a b", "x.y", "..", ".", "..a", "a/b", "/a", "a:b", "", " ", "a..b", "é"]:
        try:
            _validate_model_name(name)
            mlflow_ok = True
        except MlflowException:
            mlflow_ok = False
        try:
            check_registered_model_name(name)
            ours_ok = True
        except ValueError:
            ours_ok = False
        assert ours_ok == mlflow_ok, name


def test_an_experiment_name_longer_than_the_file_system_allows_is_one_line_before_any_run(workdir, capsys):
    limit = longest_experiment_name(workdir / "checkpoints")
    assert limit == 255 - len("-YYYYmmdd-HHMMSS.csv")  # NAME_MAX 255 on the file systems tests run on
    line = refused(capsys, ["fit", "-c", str(SPIRAL), *QUICK, "--trainer.logger.init_args.experiment_name", "x" * 300])
    assert f"is 300 bytes long, more than the {limit} this file system allows" in line
    assert "x" * 41 not in line  # the name is shown shortened
    assert not (workdir / "checkpoints").exists()
    from tests.conftest import mlflow_client

    if (workdir / "mlflow.db").exists():  # nothing left RUNNING (no run at all)
        assert mlflow_client(workdir).search_runs(
            [e.experiment_id for e in mlflow_client(workdir).search_experiments()]) == []


def test_an_experiment_name_at_the_limit_trains(workdir):
    name = "e" * longest_experiment_name(workdir / "checkpoints")
    main(["fit", "-c", str(SPIRAL), *QUICK, "--mlflow_model", "false", "--trainer.logger.init_args.experiment_name", name])
    [run] = runs_of(workdir, name)
    assert run.info.status == "FINISHED" and (workdir / "checkpoints" / name / run.info.run_id / "last.ckpt").is_file()
