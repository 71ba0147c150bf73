"""Exact evaluation on 2 CPU processes (issue 21 part 2): `recipes validate`, `recipes test` and fit's validation give
the metrics of one process, on splits of an odd size whose ranks run different numbers of batches.

Lightning's `DistributedSampler` padded 201 test samples to 202 (sample 0 counted twice) and `sync_dist` divided the
loss's summed batch sizes in an integer tensor; the data modules now give each rank an unpadded shard
(`EvaluationShardSampler`) and the loss is a metric whose sums torchmetrics adds over the ranks. The reference runs
in this process (`recipes.cli.main`); the 2-process runs are `python -m recipes` subprocesses (see tests/end_to_end/test_ddp.py).
With `--ckpt_path none` a recipe evaluates its freshly initialized network, the same on every rank (seeded).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.cli import main
from tests.conftest import CONFIGS, REPO, SPIRAL, runs_of
from tests.conftest import on_two_processes

# metrics made of counts (accuracy, F1, AUROC's ranks) come out identical; sums of floats (loss, errors, log-probs)
# are added in another order on two processes (per rank, then across), so they agree to float32 rounding
FLOAT_SUMS = ("loss", "mae", "rmse", "r2", "ppl")


def stage_metrics(directory: Path, experiment: str, stage: str, prefix: str) -> list[dict[str, float]]:
    """The ``prefix`` metrics of every ``stage`` run of ``experiment``, oldest first."""
    runs = [r for r in runs_of(directory, experiment) if r.data.tags.get("loopwise.stage") == stage]
    assert all(r.info.status == "FINISHED" for r in runs)
    return [{k: v for k, v in r.data.metrics.items() if k.startswith(prefix)} for r in runs]


def one_process(directory: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
    """`recipes <args>` in this process, in ``directory`` (data linked as the 2-process runs link it)."""
    if not (directory / "data").exists():
        (directory / "data").symlink_to(REPO / "data")
    monkeypatch.chdir(directory)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    main(list(args))


def assert_same_metrics(two: dict[str, float], one: dict[str, float], expected: set[str]) -> None:
    assert set(two) == set(one) == expected
    for name, value in one.items():
        if name.rsplit("/", 1)[-1] in FLOAT_SUMS:
            assert two[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name
        else:
            assert two[name] == value, name


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "command", "extra", "expected"),
    [
        # 201 test samples: 101 and 100 per rank, 3 and 2 batches of 50
        (
            "spiral_mlp",
            "test",
            ["--data.init_args.batch_size", "50"],
            {"test/acc", "test/f1", "test/auroc", "test/loss"},
        ),
        # 75 test rows: 38 and 37 per rank, 2 and 1 batches of 37
        (
            "regression_mlp",
            "test",
            ["--data.init_args.val_fraction", "0.17", "--data.init_args.test_fraction", "0.17",
             "--data.init_args.batch_size", "37"],
            {"test/mae", "test/rmse", "test/r2", "test/loss"},
        ),
        # 143 val windows of 64 characters: 72 and 71 per rank, 2 and 1 batches of 71; loss and perplexity per token
        (
            "charlm_gpt",
            "validate",
            ["--data.init_args.val_fraction", "0.102", "--data.init_args.batch_size", "71"],
            {"val/loss", "val/ppl"},
        ),
    ],
)
def test_evaluation_on_two_processes_gives_the_metrics_of_one(tmp_path, monkeypatch, recipe, command, extra, expected):
    extra = [*extra, "--ckpt_path", "none"]  # the network as built: the same weights on one and two processes
    on_two_processes(tmp_path, command, CONFIGS / f"{recipe}.yaml", *extra)
    one_process(tmp_path, monkeypatch, command, "-c", str(CONFIGS / f"{recipe}.yaml"), *extra)
    two, one = stage_metrics(tmp_path, recipe, command, "val/" if command == "validate" else "test/")
    assert_same_metrics(two, one, expected)


@pytest.mark.slow
def test_validation_during_a_two_process_fit_is_that_of_one_process(tmp_path, monkeypatch):
    # the text recipe: length-bucketed batches, a network with buffers (DDP broadcasts them at the first validation
    # forward), 799 val texts: 400 and 399 per rank, 4 and 3 batches of 133; the sanity check validates too
    recipe = CONFIGS / "text_transformer.yaml"
    extra = ["--data.init_args.batch_size", "133"]
    on_two_processes(
        tmp_path, "fit", recipe, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", *extra
    )
    one_process(tmp_path, monkeypatch, "validate", "-c", str(recipe), "--ckpt_path", "last", *extra)
    (fit,) = stage_metrics(tmp_path, "text_transformer", "fit", "val/")
    (validation,) = stage_metrics(tmp_path, "text_transformer", "validate", "val/")
    assert_same_metrics(fit, validation, {"val/acc", "val/f1", "val/auroc", "val/loss"})
