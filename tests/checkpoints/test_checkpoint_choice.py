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


def fake_checkpoint(path: Path, score: float, epoch: int = 3) -> None:
    """A checkpoint file as ``RunCheckpoint`` writes its state: enough for ``best`` to compare runs."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    key = "RunCheckpoint{'alias': 'best', 'monitor': 'val/acc', 'mode': 'max'}"
    torch.save({"epoch": epoch, "callbacks": {key: {"monitor": "val/acc", "best_model_score": torch.tensor(score)}}},
               path)


def test_a_damaged_best_ckpt_is_named_not_skipped_for_a_worse_run(tmp_path):
    """The better run's best.ckpt is damaged: `best` used to pick the worse run silently (issue 28, part 8a)."""
    from recipes.checkpoints.choice import choose_checkpoint

    root = tmp_path / "checkpoints"
    fake_checkpoint(root / "exp" / "worse" / "best.ckpt", 0.60)
    damaged = root / "exp" / "better" / "best.ckpt"
    fake_checkpoint(damaged, 0.95)
    damaged.write_bytes(damaged.read_bytes()[:100])  # truncated, as a full disk or a killed copy leaves it
    with pytest.raises(FileNotFoundError) as err:
        choose_checkpoint("best", "exp", root, "unused", None, runs=lambda *_: ["better", "worse"])
    message = str(err.value)
    assert f"--ckpt_path best: cannot read {damaged.resolve()} (run better): " in message
    assert "its run may be the best" in message and "--ckpt_path run:worse/best or a file path" in message
    assert len(message.splitlines()) == 1

    damaged.unlink()  # moved away: `best` chooses among the readable ones again
    chosen = choose_checkpoint("best", "exp", root, "unused", None, runs=lambda *_: ["better", "worse"])
    assert chosen.run_id == "worse" and "val/acc 0.6" in chosen.description


def test_a_damaged_last_ckpt_newer_than_the_chosen_one_is_named(tmp_path):
    import os

    from recipes.checkpoints.choice import choose_checkpoint

    root = tmp_path / "checkpoints"
    older, newer = root / "exp" / "older" / "last.ckpt", root / "exp" / "newer" / "last.ckpt"
    fake_checkpoint(older, 0.5)
    newer.parent.mkdir(parents=True)
    newer.write_bytes(b"not a checkpoint")
    os.utime(older, (1_000_000, 1_000_000))
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path last: cannot read .*newer/last.ckpt \(run newer\): "
                       r".*it is newer than every last.ckpt that can be read.*--ckpt_path run:older/last"):
        choose_checkpoint("last", "exp", root, "unused", None, runs=lambda *_: ["newer", "older"])
    os.utime(newer, (1_000, 1_000))  # an old damaged file does not stand in the way of a newer readable one
    assert choose_checkpoint("last", "exp", root, "unused", None, runs=lambda *_: ["newer", "older"]).run_id == "older"
