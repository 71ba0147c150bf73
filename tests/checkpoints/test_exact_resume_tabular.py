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
import sys
import warnings

import pytest
from lightning.pytorch.callbacks import Callback

from tests.preloaded_python import preloaded_run
from tests.conftest import CONFIGS, REPO, runs_of
from tests.exact_resume_runs import (
    ARGS,
    LIMITS,
    RECIPE,
    STOPPED_EARLY_AT,
    CrashAtStep,
    SigtermAtStep,
    assert_ends_as_the_reference,
    assert_same_training_state,
    fit,
    last_of,
    logged_values,
)


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
    from tests.conftest import recipes_env

    (workdir / "data").symlink_to(REPO / "data")
    kill = {"class_path": "tests.checkpoints.test_exact_resume_tabular.KillNineAtStep", "init_args": {"step": 10}}
    command = [sys.executable, "-m", "recipes", "fit", "-c", str(CONFIGS / f"{RECIPE}.yaml"), *LIMITS, *ARGS,
               f"--trainer.callbacks+={json.dumps(kill)}"]
    out = preloaded_run(command, cwd=workdir, env=recipes_env(), timeout=300)
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
