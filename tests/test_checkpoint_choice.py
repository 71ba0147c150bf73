"""``--ckpt_path best`` is the best checkpoint of the experiment's finished fit runs, not the newest file; smoke runs
never become ``best`` or ``last``; ``run:<id>/best`` names one run."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipes.cli import main
from tests.conftest import CONFIGS, SPIRAL, mlflow_client, runs_of

LIMITS = ["--trainer.limit_val_batches", "2"]
BETTER = ["--trainer.max_epochs", "4", *LIMITS]
WORSE = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--model.init_args.optimizer.init_args.lr",
         "1e-6", *LIMITS]


def best_val_acc(directory: Path, run_id: str) -> float:
    return max(m.value for m in mlflow_client(directory).get_metric_history(run_id, "val/acc"))


def evaluated_checkpoint(directory: Path) -> str:
    return runs_of(directory, "spiral_mlp")[-1].data.tags["loopwise.ckpt_path"]


@pytest.mark.slow
def test_best_is_the_best_finished_run_whatever_the_order_and_smoke_runs_never_count(workdir, capsys):
    main(["fit", "-c", str(SPIRAL), *BETTER])
    main(["fit", "-c", str(SPIRAL), *WORSE])  # newer, worse: the old `best` (newest file) took this one
    better, worse = runs_of(workdir, "spiral_mlp")
    assert best_val_acc(workdir, better.info.run_id) > best_val_acc(workdir, worse.info.run_id) + 0.05
    main(["fit", "-c", str(SPIRAL), "-c", str(CONFIGS / "trainer" / "debug.yaml")])  # untracked smoke run
    assert len(runs_of(workdir, "spiral_mlp")) == 2
    capsys.readouterr()

    main(["validate", "-c", str(SPIRAL), "--ckpt_path", "best"])
    said = capsys.readouterr().out
    assert "--ckpt_path best = " in said and f"(run {better.info.run_id}, epoch " in said
    assert "val/acc" in said and "best of 2 finished fit run(s)" in said
    assert evaluated_checkpoint(workdir).endswith(f"{better.info.run_id}/best.ckpt")

    main(["fit", "-c", str(SPIRAL), *WORSE])  # the order does not matter
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", "best"])
    assert evaluated_checkpoint(workdir).endswith(f"{better.info.run_id}/best.ckpt")

    # `last` is the newest tracked fit run's last.ckpt, never the smoke run's
    main(["fit", "-c", str(SPIRAL), "-c", str(CONFIGS / "trainer" / "debug.yaml")])
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", "last"])
    newest_fit = [r for r in runs_of(workdir, "spiral_mlp") if r.data.tags["loopwise.stage"] == "fit"][-1]
    assert evaluated_checkpoint(workdir).endswith(f"{newest_fit.info.run_id}/last.ckpt")

    # run:<id>/best names one run; an unknown one is a one-line error
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", f"run:{worse.info.run_id}/best"])
    assert evaluated_checkpoint(workdir).endswith(f"{worse.info.run_id}/best.ckpt")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["validate", "-c", str(SPIRAL), "--ckpt_path", "run:nosuchrun/best"])
    assert stop.value.code == 2
    assert "--ckpt_path run:nosuchrun/best: no " in capsys.readouterr().err
