"""The exact-resume tests' runs: a recipe fit in this process with injected callbacks, the training state of its
``last.ckpt``, and the uninterrupted tabular reference run that stopped-and-resumed runs must end as (shared by
tests/checkpoints/test_exact_resume*.py and tests/end_to_end/test_kill_9_trials.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import recipes.cli as cli
from recipes.run.recipes_cli import RecipesCLI
from tests.conftest import CONFIGS, REPO, mlflow_client, runs_of


LIMITS = ["--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2"]


class SigtermAtStep(Callback):
    """Lightning's SIGTERM path (stop after this batch, RunContinuity saves last.ckpt) at a global step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer._signal_connector.received_sigterm = True


def fit(monkeypatch, recipe: str | Path, *args: str, extra_callbacks: list | None = None) -> None:
    original = RecipesCLI.default_callbacks
    if extra_callbacks:
        monkeypatch.setattr(
            RecipesCLI, "default_callbacks", lambda self, cfg: original(self, cfg) + list(extra_callbacks)
        )
    try:
        config = recipe if isinstance(recipe, Path) else CONFIGS / f"{recipe}.yaml"
        cli.main(["fit", "-c", str(config), *LIMITS, *args])
    finally:
        monkeypatch.setattr(RecipesCLI, "default_callbacks", original)


def last_of(workdir: Path, recipe: str, run_id: str) -> dict:
    return torch.load(workdir / "checkpoints" / recipe / run_id / "last.ckpt", weights_only=True)


def assert_same_training_state(a: dict, b: dict) -> None:
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"])
    assert a["state_dict"].keys() == b["state_dict"].keys()
    differ = [k for k in a["state_dict"] if not torch.equal(a["state_dict"][k], b["state_dict"][k])]
    assert differ == [], f"parameters differ: {differ}"
    opt_a, opt_b = a["optimizer_states"][0], b["optimizer_states"][0]
    assert opt_a["param_groups"] == opt_b["param_groups"]  # LR, betas, step counts of the schedule's groups
    for index, state in opt_a["state"].items():
        for name, value in state.items():
            assert torch.equal(value, opt_b["state"][index][name]), f"optimizer state {index}.{name} differs"
    assert a["lr_schedulers"] == b["lr_schedulers"]  # position and last LR of the schedule


class CrashAtStep(Callback):
    """Dies before the batch after global step ``step`` (a hard kill's checkpoint: whatever was written before)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash after step {self.step}")


RECIPE = "tabular_mlp"
#: the tabular recipe as it was before issue 55 (MLP, Plateau, class-balanced sampling): these runs were built on it
BEFORE_55 = REPO / "tests" / "data" / "configs" / "tabular_before_55.yaml"


ARGS = [
    "-c", str(BEFORE_55),
    "--trainer.max_epochs", "8",
    "--early_stopping_patience", "2",
    "--model.init_args.schedule.init_args.patience", "0",
    "--checkpoint_every_n_steps", "3",
    "--system_metrics_interval", "0",
    "--mlflow_model", "false",
]


STOPPED_EARLY_AT = 5  # the reference's last epoch (0-based): early stopping, not max_epochs


def logged_values(directory: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Every metric of a run as sorted (step, value) pairs, repeated writes of one value at one step counted once;
    the loop doctor's diagnostics (timings, a check re-run when the run resumes) left out."""
    client = mlflow_client(directory)
    run = client.get_run(run_id)
    return {
        key: sorted({(m.step, m.value) for m in client.get_metric_history(run_id, key)})
        for key in run.data.metrics
        if not key.startswith("doctor/")
    }


def assert_ends_as_the_reference(workdir: Path, run_id: str, reference: dict) -> None:
    ours, theirs = last_of(workdir, RECIPE, run_id), reference["last"]
    assert_same_training_state(theirs, ours)  # includes the plateau's last_epoch, best, num_bad_epochs
    assert ours["epoch"] == STOPPED_EARLY_AT  # early stopping at the same epoch
    logged = logged_values(workdir, run_id)
    assert logged.keys() == reference["logged"].keys()
    for key in ("train/acc", "train/f1", "val/loss", "val/acc", "lr/decay"):
        assert logged[key] == reference["logged"][key], key
    assert logged == reference["logged"]


def reference_run(directory: Path) -> dict:
    """The uninterrupted tabular run in ``directory`` (the working directory): its last checkpoint and logged values."""
    with pytest.MonkeyPatch.context() as mp:
        (directory / "data").symlink_to(REPO / "data")
        fit(mp, RECIPE, *ARGS)
        (run,) = runs_of(directory, RECIPE)
        assert run.info.status == "FINISHED"
        return {"last": last_of(directory, RECIPE, run.info.run_id), "logged": logged_values(directory, run.info.run_id)}
