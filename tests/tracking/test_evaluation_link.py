"""An evaluation run carries the id and the params of the fit run that produced its checkpoint."""

from __future__ import annotations

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL, runs_of

pytestmark = pytest.mark.usefixtures("one_thread")


def test_validate_and_test_runs_name_their_fit_run_and_carry_its_params(workdir):
    short = ["--trainer.max_epochs", "1", "--data.init_args.n_samples", "400"]
    main(["fit", "-c", str(SPIRAL), *short, "--model.init_args.optimizer.init_args.lr", "0.003"])
    main(["test", "-c", str(SPIRAL), *short, "--ckpt_path", "best"])
    main(["validate", "-c", str(SPIRAL), *short, "--ckpt_path", "last"])
    fit, test, validate = runs_of(workdir, "spiral_mlp")
    for evaluation in (test, validate):
        assert evaluation.data.tags["loopwise.fit_run_id"] == fit.info.run_id
        assert evaluation.data.tags["loopwise.fit_run_name"] == fit.info.run_name
        assert evaluation.data.params == fit.data.params and evaluation.data.params["lr"] == "0.003"
    assert "loopwise.fit_run_id" not in fit.data.tags
