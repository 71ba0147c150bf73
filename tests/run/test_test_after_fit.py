"""Issue 57: fit and test in one command. `recipes fit ... --test_after_fit true` tests the best.ckpt of the fit it
just ran, in the same process, as `recipes test ... --ckpt_path best` would: a test run of its own, tagged with that
fit's run id, even where an earlier fit of the recipe scored better (plain `--ckpt_path best` would pick that one)."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient

from recipes.cli import main, after_fit_test_arguments
from tests.conftest import SPIRAL


def runs_by_stage(stage: str) -> list:
    """The runs of the working directory's store (not MLflow's global URI, which another test may have set)."""
    client = MlflowClient(f"sqlite:///{Path.cwd() / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, filter_string=f"tags.`loopwise.stage` = '{stage}'",
                              order_by=["start_time ASC"])


def test_fit_then_test_of_that_fit_in_one_command(workdir):
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3"])  # the better earlier fit: 3 epochs
    assert not runs_by_stage("test")  # a plain fit tests nothing
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--test_after_fit", "true"])
    earlier, latest = runs_by_stage("fit")
    assert latest.data.metrics["val/loss"] > earlier.data.metrics["val/loss"]  # "best" alone would name the earlier
    [test] = runs_by_stage("test")
    assert test.data.tags["loopwise.fit_run_id"] == latest.info.run_id  # this fit's best.ckpt was tested
    assert {"test/loss", "test/acc"} <= set(test.data.metrics)
    assert test.info.status == "FINISHED"


def test_the_test_command_is_the_fit_command_with_the_fit_s_checkpoint():
    assert after_fit_test_arguments(["fit", "-c", "r.yaml", "--ckpt_path", "last"], "/c/best.ckpt") == [
        "test", "-c", "r.yaml", "--ckpt_path", "last", "--ckpt_path", "/c/best.ckpt"]
    assert after_fit_test_arguments(["-c", "r.yaml", "fit", "--x", "1"], "best") == [
        "-c", "r.yaml", "test", "--x", "1", "--ckpt_path", "best"]


def test_a_fit_stopped_before_it_finished_is_not_tested(workdir):
    # fast_dev_run: Lightning's debugging pass, no checkpoint; the fit is not one to test
    main(["fit", "-c", str(SPIRAL), "--trainer.fast_dev_run", "1", "--test_after_fit", "true"])
    assert not runs_by_stage("test")
