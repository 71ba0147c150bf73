"""Fine-tuning through the ``recipes`` command: an earlier run as the start, what MLflow records, bad references."""

from __future__ import annotations

import json

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL, mlflow_client, runs_of

pytestmark = pytest.mark.usefixtures("one_thread")
SHORT = ["--trainer.max_epochs", "2", "--data.init_args.n_samples", "600"]


@pytest.mark.slow
def test_a_run_fine_tunes_an_earlier_run_and_mlflow_shows_what_was_loaded_and_trainable_when(workdir, capsys):
    main(["fit", "-c", str(SPIRAL), *SHORT])
    pretrained = runs_of(workdir, "spiral_mlp")[0].info.run_id
    main([
        "fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3", "--data.init_args.n_samples", "600",
        "--model.init_args.init_from", f"mlflow:{pretrained}/best",
        "--model.init_args.freeze", "[net.0]", "--model.init_args.unfreeze_at_epoch", "1",
        "--model.init_args.lr_multipliers", "{net.0: 0.1}",
    ])
    out = capsys.readouterr().out
    assert f"recipes: init_from mlflow:{pretrained}/best: 6 tensors (17,283 parameters) loaded into the network" in out
    assert "parameters from epoch 0  16,899 trainable, 384 frozen" in out  # net.0: 2*128 + 128
    assert "parameters from epoch 1  17,283 trainable, 0 frozen" in out
    assert "LoopDoctor: no findings" in out  # no initial-loss alarm for loaded weights, frozen ones not "dead"
    run = runs_of(workdir, "spiral_mlp")[1]
    client = mlflow_client(workdir)
    params, tags = run.data.params, run.data.tags
    assert params["init_from.path"] == f"mlflow:{pretrained}/best" and tags["loopwise.init_from"] == params["init_from.path"]
    assert params["init_from.loaded_tensors"] == "6" and params["init_from.missing"] == "0"
    assert json.loads(params["freeze"]) == {"net.0": 1} and json.loads(params["lr_multipliers"]) == {"net.0": 0.1}
    assert params["plan.trainable_parameters"] == "16899" and params["plan.frozen_parameters"] == "384"
    assert params["plan.phases"] == "epoch 0: 16899 trainable, 384 frozen; epoch 1: 17283 trainable, 0 frozen"
    trainable = [m.value for m in client.get_metric_history(run.info.run_id, "trainable_parameters")]
    assert trainable == [16899, 17283, 17283]
    report = json.loads(open(client.download_artifacts(run.info.run_id, "init_from.json")).read())
    assert report["loaded_parameters"] == 17283 and report["missing"] == [] and report["mismatched"] == []
    # the learning rate of each part, by name, at the multiplier's ratio on every step
    base = client.get_metric_history(run.info.run_id, "lr/decay")
    part = client.get_metric_history(run.info.run_id, "lr/net.0/decay")
    assert len(base) == len(part) >= 2  # every log_every_n_steps
    assert all(p.value == pytest.approx(0.1 * b.value) for b, p in zip(base, part))
    assert "doctor.initial_loss" not in tags or "skip" in tags["doctor.initial_loss"]
    # the fine-tuned checkpoint evaluates without fetching the pretrained one again
    main(["test", "-c", str(SPIRAL), "--data.init_args.n_samples", "600", "--ckpt_path", "best"])
    assert runs_of(workdir, "spiral_mlp")[-1].data.metrics["test/acc"] > 0.8


@pytest.mark.parametrize(
    ("init_from", "extra", "message"),
    [
        ("missing.pt", [], "init_from: no file"),
        ("mlflow:0123abcd/best", [], "init_from mlflow:0123abcd/best: no MLflow run '0123abcd'"),
        ("net.pt", ["--model.init_args.model.init_args.hidden_sizes", "[8, 8]"],
         "net.0.weight file (16, 2) vs network (8, 2)"),
    ],
    ids=["missing", "unknown_run", "shapes"],
)
def test_a_bad_init_from_is_one_line_before_any_run(workdir, capsys, init_from, extra, message):
    import torch

    from lightning_modules.models import MLP

    torch.save(MLP(2, 3, [16, 16]).state_dict(), workdir / "net.pt")
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(SPIRAL), *SHORT, "--model.init_args.init_from", init_from, *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    line = next(line for line in err.splitlines() if line.startswith("recipes: error:"))
    assert message in line
    assert all(run.info.status != "RUNNING" for run in runs_of(workdir, "spiral_mlp"))
