"""Convergence of the image and tabular recipes through the `recipes` command (slow: full runs)."""

from __future__ import annotations

import pytest

from recipes.cli import main
from tests.conftest import CONFIGS, REPO, runs_of


def fit_and_test(workdir, name: str) -> dict[str, float]:
    (workdir / "data").symlink_to(REPO / "data")
    config = str(CONFIGS / f"{name}.yaml")
    main(["fit", "-c", config])
    main(["test", "-c", config, "--ckpt_path", "best"])
    runs = runs_of(workdir, name)
    assert [r.data.tags["loopwise.stage"] for r in runs] == ["fit", "test"]
    assert all(r.info.status == "FINISHED" for r in runs)
    return runs[-1].data.metrics


@pytest.mark.slow
def test_digits_convnet_reaches_097_test_accuracy(workdir):
    metrics = fit_and_test(workdir, "digits_convnet")
    assert metrics["test/acc"] >= 0.97


@pytest.mark.slow
def test_tabular_mlp_beats_chance_ranking_with_early_stopping(workdir):
    metrics = fit_and_test(workdir, "tabular_mlp")
    assert metrics["test/auroc"] >= 0.72  # HistGradientBoosting on the same split: 0.75
    fit = runs_of(workdir, "tabular_mlp")[0]
    assert fit.data.params["schedule"] == "Plateau"


@pytest.mark.slow
def test_regression_mlp_explains_half_the_variance(workdir):
    metrics = fit_and_test(workdir, "regression_mlp")
    assert metrics["test/r2"] >= 0.45  # Ridge on the same split: 0.53
    assert 30 < metrics["test/rmse"] < 60  # in the target's own units (progression score, std about 77)
