"""Mid-epoch resume of the tabular recipe (ReduceLROnPlateau, dropout, class-balanced sampling, early stopping) ends
bit-identical to the uninterrupted run, and logs the same values.

One uninterrupted reference run (module-scoped) is compared with runs stopped at chosen moments and resumed with
``--ckpt_path last``: SIGTERM in the middle of an epoch, at an epoch's last batch and during its validation (both
failed before StopOnSignal held the stop until the validation's end), a real ``kill -9``, and a hard crash (the process
dies, whatever was written stays) with ``--checkpoint_every_n_steps 3`` in the middle of an epoch, just after a
step checkpoint, just after an epoch-end checkpoint, during the epoch-end validation and at the epoch's last batch.
Each must end with the reference's parameters, optimizer state and scheduler state (ReduceLROnPlateau's
``last_epoch``, ``best``, ``num_bad_epochs``), stop early at the same epoch, and have the same values in MLflow at the
same steps (``train/acc`` and ``train/f1`` of the resumed epoch cover all of its batches, not only those after the
resume).

Settings: 6 train batches and 2 val batches per epoch, checkpoints every 3 steps (steps 3, 6 at epoch 0's validation,
9, 12 at epoch 1's validation, ...), Plateau patience 0 (the LR halves at every epoch without improvement), early
stopping patience 2: the reference halves the LR at epochs 2, 4 and 5 and stops after epoch 5 of 8.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback

from tests.conftest import CONFIGS, REPO, mlflow_client, runs_of
from tests.checkpoints.test_exact_resume import (
    LIMITS,
    CrashAtStep,
    SigtermAtStep,
    assert_same_training_state,
    fit,
    last_of,
)

RECIPE = "tabular_mlp"
ARGS = [
    "--trainer.max_epochs", "8",
    "--early_stopping_patience", "2",
    "--model.init_args.schedule.init_args.patience", "0",
    "--checkpoint_every_n_steps", "3",
    "--system_metrics_interval", "0",
    "--mlflow_model", "false",
]
STOPPED_EARLY_AT = 5  # the reference's last epoch (0-based): early stopping, not max_epochs


class CrashAfterStepSaved(Callback):
    """Dies at the start of the batch after global step ``step``: the checkpoint of that step is the newest file."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash just after step {self.step}'s checkpoint")


class CrashDuringValidation(Callback):
    """Dies at the second batch of epoch ``epoch``'s validation."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch and batch_idx == 1:
            raise RuntimeError("simulated crash during validation")


class SigtermDuringValidation(Callback):
    """Lightning's SIGTERM path at the first batch of epoch ``epoch``'s validation."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking and trainer.current_epoch == self.epoch and batch_idx == 0:
            trainer._signal_connector.received_sigterm = True


class CrashAtLastBatch(Callback):
    """Dies after the optimizer step of epoch ``epoch``'s last batch, before its validation."""

    def __init__(self, epoch: int, batches: int = 6) -> None:
        self.epoch, self.batches = epoch, batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.current_epoch == self.epoch and batch_idx == self.batches - 1:
            raise RuntimeError("simulated crash at the epoch's last batch")


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


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run: its last checkpoint and its logged values."""
    directory = tmp_path_factory.mktemp("reference")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(directory)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        (directory / "data").symlink_to(REPO / "data")
        fit(mp, RECIPE, *ARGS)
        (run,) = runs_of(directory, RECIPE)
        assert run.info.status == "FINISHED"
        return {"last": last_of(directory, RECIPE, run.info.run_id), "logged": logged_values(directory, run.info.run_id)}


def test_the_reference_stops_early_after_lr_reductions(reference):
    last = reference["last"]
    assert last["epoch"] == STOPPED_EARLY_AT and last["global_step"] == 6 * (STOPPED_EARLY_AT + 1)
    plateau = last["lr_schedulers"][0]
    assert plateau["last_epoch"] == STOPPED_EARLY_AT + 1  # one plateau step per epoch
    assert plateau["_last_lr"][0] < 0.003 / 4  # halved at least three times
    lrs = {value for _, value in reference["logged"]["lr/decay"]}
    assert len(lrs) >= 2  # (logged every 10 steps)


# case id -> (callback that stops the run, exit: "sigterm" or "crash", global step of the checkpoint resumed from)
STOPS = {
    "sigterm-mid-epoch": (lambda: SigtermAtStep(8), "sigterm", 8),
    "sigterm-at-epoch-last-batch": (lambda: SigtermAtStep(12), "sigterm", 12),
    "sigterm-during-validation": (lambda: SigtermDuringValidation(1), "sigterm", 12),
    "crash-mid-epoch": (lambda: CrashAtStep(10), "crash", 9),
    "crash-just-after-step-checkpoint": (lambda: CrashAfterStepSaved(9), "crash", 9),
    "crash-just-after-epoch-end-checkpoint": (lambda: CrashAfterStepSaved(6), "crash", 6),
    "crash-during-validation": (lambda: CrashDuringValidation(1), "crash", 9),
    "crash-at-epoch-last-batch": (lambda: CrashAtLastBatch(1), "crash", 9),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(STOPS))
def test_tabular_resume_equals_the_uninterrupted_run(workdir, monkeypatch, reference, case):
    """Weights, optimizer, plateau scheduler, early-stopping epoch and every logged value equal the reference's
    (before: the plateau scheduler was one step behind after a mid-epoch resume, and the resumed epoch's train/acc
    and train/f1 covered only the batches after the resume)."""
    (workdir / "data").symlink_to(REPO / "data")
    make_stop, how, resumed_from = STOPS[case]
    if how == "sigterm":
        with pytest.raises(SystemExit) as exc:
            fit(monkeypatch, RECIPE, *ARGS, extra_callbacks=[make_stop()])
        assert exc.value.code == 143
    else:
        with pytest.raises(RuntimeError, match="simulated crash"):
            fit(monkeypatch, RECIPE, *ARGS, extra_callbacks=[make_stop()])
    (stopped,) = runs_of(workdir, RECIPE)
    assert last_of(workdir, RECIPE, stopped.info.run_id)["global_step"] == resumed_from
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ended before the epoch ended.*")
        fit(monkeypatch, RECIPE, *ARGS, "--ckpt_path", "last")
    (resumed,) = runs_of(workdir, RECIPE)
    assert resumed.info.run_id == stopped.info.run_id and resumed.info.status == "FINISHED"

    assert_ends_as_the_reference(workdir, stopped.info.run_id, reference)


def assert_ends_as_the_reference(workdir: Path, run_id: str, reference: dict) -> None:
    ours, theirs = last_of(workdir, RECIPE, run_id), reference["last"]
    assert_same_training_state(theirs, ours)  # includes the plateau's last_epoch, best, num_bad_epochs
    assert ours["epoch"] == STOPPED_EARLY_AT  # early stopping at the same epoch
    logged = logged_values(workdir, run_id)
    assert logged.keys() == reference["logged"].keys()
    for key in ("train/acc", "train/f1", "val/loss", "val/acc", "lr/decay"):
        assert logged[key] == reference["logged"][key], key
    assert logged == reference["logged"]


class KillNineAtStep(Callback):
    """SIGKILL to its own process at the start of the batch after global step ``step``: nothing runs after it (no
    exception hook, no write of the metrics MLflow was holding), as with ``kill -9`` or the OOM killer."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
def test_a_real_kill_9_mid_epoch_resumes_to_the_uninterrupted_run(workdir, monkeypatch, reference):
    """A fit in its own process killed with SIGKILL before step 11 (step 9's checkpoint is the newest), resumed with
    ``--ckpt_path last``: the same end and the same logged values as the reference."""
    from tests.end_to_end.test_ddp import recipes_env

    (workdir / "data").symlink_to(REPO / "data")
    kill = {"class_path": "tests.test_exact_resume_tabular.KillNineAtStep", "init_args": {"step": 10}}
    command = [sys.executable, "-m", "recipes", "fit", "-c", str(CONFIGS / f"{RECIPE}.yaml"), *LIMITS, *ARGS,
               f"--trainer.callbacks+={json.dumps(kill)}"]
    out = subprocess.run(command, cwd=workdir, env=recipes_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == -signal.SIGKILL, out.stdout[-2000:] + out.stderr[-2000:]
    (killed,) = runs_of(workdir, RECIPE)
    assert last_of(workdir, RECIPE, killed.info.run_id)["global_step"] == 9
    fit(monkeypatch, RECIPE, *ARGS, "--ckpt_path", "last")
    (resumed,) = runs_of(workdir, RECIPE)
    assert resumed.info.run_id == killed.info.run_id and resumed.info.status == "FINISHED"
    assert_ends_as_the_reference(workdir, killed.info.run_id, reference)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["WarmupCosine", "OneCycle", "Plateau", "Constant"])
def test_every_schedule_resumes_mid_epoch_exactly_with_the_same_logged_values(workdir, monkeypatch, schedule):
    """The spiral recipe with each schedule a task offers, SIGTERM after step 8 (epoch 1, batch 1 of 6): the resumed
    run ends with the uninterrupted run's weights, optimizer and scheduler state and logs the same values, epoch 1's
    train/acc and train/f1 included (before: the plateau scheduler one step behind, and the resumed epoch's train
    metrics covering batches 2-5 only)."""
    args = [
        "--trainer.max_epochs", "3",
        "--model.init_args.schedule", f'{{"class_path": "lightning_modules.optim.{schedule}"}}',
        "--system_metrics_interval", "0",
        "--mlflow_model", "false",
    ]
    fit(monkeypatch, "spiral_mlp", *args)
    with pytest.raises(SystemExit):
        fit(monkeypatch, "spiral_mlp", *args, extra_callbacks=[SigtermAtStep(8)])
    fit(monkeypatch, "spiral_mlp", *args, "--ckpt_path", "last")
    straight, stopped = runs_of(workdir, "spiral_mlp")
    assert stopped.info.status == "FINISHED"
    a, b = last_of(workdir, "spiral_mlp", straight.info.run_id), last_of(workdir, "spiral_mlp", stopped.info.run_id)
    assert (a["epoch"], a["global_step"]) == (2, 18)
    assert_same_training_state(a, b)
    assert (a["lr_schedulers"] == []) == (schedule == "Constant")
    if schedule == "Plateau":
        assert b["lr_schedulers"][0]["last_epoch"] == 3  # epochs 0, 1 and 2 stepped, the last before last.ckpt
    logged = logged_values(workdir, stopped.info.run_id)
    assert logged == logged_values(workdir, straight.info.run_id)
    assert len(logged["train/acc"]) == 3
