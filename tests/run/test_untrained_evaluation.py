"""No evaluation of weights nobody trained (issue 31, point 2): ``validate``, ``test`` and ``predict`` without
``--ckpt_path`` and without the model's ``init_from`` stop in one line before any run is made; ``--ckpt_path none``
evaluates the network as built, on purpose, and the run records it (tag ``loopwise.ckpt_path_given: none``)."""

from __future__ import annotations

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL, runs_of

SHORT = ["--trainer.limit_val_batches", "2", "--trainer.limit_test_batches", "2", "--trainer.limit_predict_batches", "2"]


def one_line_error(capsys, args: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("recipes: error: "), err
    return err[0]


@pytest.mark.parametrize("stage", ["validate", "test", "predict"])
def test_an_evaluation_without_ckpt_path_stops_in_one_line_and_makes_no_run(workdir, capsys, stage):
    line = one_line_error(capsys, [stage, "-c", str(SPIRAL)])
    assert line == (
        f"recipes: error: {stage} without --ckpt_path would evaluate a network nobody trained: pass "
        "--ckpt_path best|last|run:<id>/best|last|mlflow:<id>/best|last|<file>, or --ckpt_path none to evaluate the "
        "untrained network on purpose"
    )
    assert runs_of(workdir, "spiral_mlp") == []
    assert not (workdir / "checkpoints").exists()


@pytest.mark.parametrize(("stage", "value", "message"), [
    ("test", "None", "--ckpt_path None: write --ckpt_path none (lower case)"),
    ("fit", "none", "--ckpt_path none: only validate, test and predict take it"),
], ids=["None", "fit"])
def test_none_in_another_case_or_for_fit_is_one_line(workdir, capsys, stage, value, message):
    assert message in one_line_error(capsys, [stage, "-c", str(SPIRAL), "--ckpt_path", value])
    assert runs_of(workdir, "spiral_mlp") == []


@pytest.mark.parametrize("stage", ["test", "predict"])
def test_ckpt_path_none_evaluates_the_network_as_built_and_tags_the_run(workdir, capsys, stage):
    main([stage, "-c", str(SPIRAL), "--ckpt_path", "none", *SHORT])
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.info.status == "FINISHED"
    assert run.data.tags["loopwise.stage"] == stage
    assert run.data.tags["loopwise.ckpt_path_given"] == "none"
    assert "loopwise.ckpt_path" not in run.data.tags  # no file was evaluated
    if stage == "test":
        assert 0.0 <= run.data.metrics["test/acc"] <= 1.0


def test_an_evaluation_of_the_models_init_from_needs_no_ckpt_path(workdir, capsys):
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
          "--mlflow_model", "false"])  # fmt: skip
    (last,) = (workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt")
    main(["test", "-c", str(SPIRAL), "--model.init_args.init_from", str(last), *SHORT])
    main(["test", "-c", str(SPIRAL), "--ckpt_path", str(last), *SHORT])
    fit, initialised, restored = runs_of(workdir, "spiral_mlp")
    assert initialised.data.tags["loopwise.stage"] == "test" and initialised.info.status == "FINISHED"
    assert "loopwise.ckpt_path_given" not in initialised.data.tags
    # the network evaluated is the init_from checkpoint's: the same scores as testing that checkpoint itself
    assert initialised.data.metrics["test/loss"] == pytest.approx(restored.data.metrics["test/loss"], abs=1e-6)
    assert initialised.data.metrics["test/acc"] == restored.data.metrics["test/acc"]
