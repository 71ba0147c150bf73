"""A run stopped and resumed with ``--ckpt_path last`` ends exactly where an uninterrupted run does.

Epoch boundary (a crash or kill after an epoch's ``last.ckpt``): parameters, optimizer state and LR schedule are
bit-for-bit those of the uninterrupted run (CPU, ``deterministic: true``), for the spiral recipe (plain shuffling),
the tabular one (dropout + ClassBalancedSampler) and the text one (dropout + EpochRandomSampler + length buckets).

Mid-epoch (SIGTERM / Ctrl+C save ``last.ckpt`` after the current batch): exact too, for the same recipes and an
image-folder one whose images 2 worker processes decode: the train loader's position (epoch, batches trained) is in
the checkpoint and the resumed epoch goes on with the batches the stop left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tests.conftest import CONFIGS, REPO, runs_of
from tests.exact_resume_runs import (
    LIMITS,
    CrashAtStep,
    SigtermAtStep,
    assert_same_training_state,
    fit,
    last_of,
)


class CrashAtEpochStart(Callback):
    """Dies at the start of epoch ``epoch``, after the previous epoch wrote its checkpoints."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise RuntimeError(f"simulated crash at the start of epoch {self.epoch}")


class BatchRecorder(Callback):
    """(epoch, batch_idx, labels of the batch) of every training batch."""

    def __init__(self, records: list) -> None:
        self.records = records

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        labels = batch["labels"] if isinstance(batch, dict) else batch[1]
        self.records.append((trainer.current_epoch, batch_idx, tuple(labels.tolist())))


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, epochs, crash_at",
    [("spiral_mlp", 4, 2), ("tabular_mlp", 3, 1), ("text_transformer", 3, 1), ("image_folder_convnet", 2, 1)],
    ids=["spiral", "tabular-dropout-balanced-sampler", "text-dropout-length-buckets", "image-folder-2-workers"],
)
def test_resume_at_an_epoch_boundary_equals_the_uninterrupted_run(workdir, monkeypatch, recipe, epochs, crash_at):
    """(With workers, the resumed epoch used to follow epoch 0's order: the loader drew its first indices at
    ``iter()``, before Lightning had restored the epoch.)"""
    if (REPO / "data").is_dir():
        (workdir / "data").symlink_to(REPO / "data")
    config = image_folder_recipe(workdir) if recipe == "image_folder_convnet" else CONFIGS / f"{recipe}.yaml"
    max_epochs = ["--trainer.max_epochs", str(epochs)]
    fit(monkeypatch, config, *max_epochs)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(monkeypatch, config, *max_epochs, extra_callbacks=[CrashAtEpochStart(crash_at)])
    straight, crashed = runs_of(workdir, recipe)
    assert crashed.info.status == "FAILED"
    assert last_of(workdir, recipe, crashed.info.run_id)["epoch"] == crash_at - 1
    fit(monkeypatch, config, *max_epochs, "--ckpt_path", "last")  # the newest last.ckpt: the crashed run's
    resumed = runs_of(workdir, recipe)[1]
    assert resumed.info.run_id == crashed.info.run_id and resumed.info.status == "FINISHED"

    a, b = last_of(workdir, recipe, straight.info.run_id), last_of(workdir, recipe, crashed.info.run_id)
    assert a["epoch"] == epochs - 1
    # everything recipes put in a checkpoint loads weights-only (tensors and plain values): best.ckpt too
    best = torch.load(workdir / "checkpoints" / recipe / crashed.info.run_id / "best.ckpt", weights_only=True)
    assert {"state_dict", "loops", "optimizer_states", "hyper_parameters", "loopwise"} <= set(best)
    assert {"torch", "numpy", "python"} <= set(best["callbacks"]["RandomStates"])
    if recipe == "text_transformer":  # the data module's vocabulary travels as plain lists
        assert len(best["TextClassificationDataModule"]["vocabulary"]["itos"]) > 100
    assert_same_training_state(a, b)
    # the random generators went on as in the uninterrupted run, too
    sa, sb = a["callbacks"]["RandomStates"], b["callbacks"]["RandomStates"]
    assert torch.equal(sa["torch"], sb["torch"]) and torch.equal(sa["numpy"]["keys"], sb["numpy"]["keys"])
    # and the logged validation curve of the resumed epochs is the same
    from tests.conftest import mlflow_client

    client = mlflow_client(workdir)
    curve = {
        run.info.run_id: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val/loss"))
        for run in (straight, crashed)
    }
    assert curve[straight.info.run_id] == curve[crashed.info.run_id]


IMAGE_FOLDER_RECIPE = """\
seed_everything: 0
torch_threads: 2
trainer:
  max_epochs: 2
  deterministic: true
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    model:
      class_path: lightning_modules.models.ConvNet
      init_args: {widths: [8], blocks_per_stage: 1, dropout: 0.2}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: 0.01}
    schedule:
      class_path: lightning_modules.optim.OneCycle
      init_args: {max_lr: 0.01}
data:
  class_path: datamodules.ImageFolderDataModule
  init_args: {root: images, image_size: 8, batch_size: 8, val_fraction: 0.2, num_workers: 2, seed: 0}
"""


def image_folder_recipe(workdir: Path) -> Path:
    """A small image-folder recipe (ConvNet with dropout, OneCycle) on 3 x 40 PNGs, decoded by 2 worker processes."""
    from tests.data_files import make_folder

    make_folder(workdir / "images", {"a": 40, "b": 40, "c": 40}, size=(8, 8))
    path = workdir / "image_folder_convnet.yaml"
    path.write_text(IMAGE_FOLDER_RECIPE)
    return path


def in_epoch(log: list, epoch: int) -> list:
    return [b for b in log if b[0] == epoch]


# recipe, epochs, global step after which SIGTERM stops it (6 batches per epoch: step 8 is epoch 1's batch 1)
MID_EPOCH = [
    ("spiral_mlp", 3, 8),
    ("tabular_mlp", 2, 9),
    ("text_transformer", 2, 8),
    ("image_folder_convnet", 2, 9),
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, epochs, stop_at",
    MID_EPOCH,
    ids=["spiral", "tabular-dropout-balanced-sampler", "text-dropout-length-buckets", "image-folder-2-workers"],
)
def test_resume_after_a_mid_epoch_sigterm_equals_the_uninterrupted_run(workdir, monkeypatch, recipe, epochs, stop_at):
    """SIGTERM after batch k of an epoch saves last.ckpt there; ``--ckpt_path last`` trains the epoch's remaining
    batches (the loader skips the first k of the epoch's order, Lightning's batch index and step go on) and ends
    bit-for-bit where the uninterrupted run ends."""
    if (REPO / "data").is_dir():
        (workdir / "data").symlink_to(REPO / "data")
    config = image_folder_recipe(workdir) if recipe == "image_folder_convnet" else CONFIGS / f"{recipe}.yaml"
    max_epochs = ["--trainer.max_epochs", str(epochs)]
    straight_log: list = []
    fit(monkeypatch, config, *max_epochs, extra_callbacks=[BatchRecorder(straight_log)])
    stopped_log: list = []
    with pytest.raises(SystemExit) as exc:
        fit(monkeypatch, config, *max_epochs, extra_callbacks=[SigtermAtStep(stop_at), BatchRecorder(stopped_log)])
    assert exc.value.code == 143
    straight, stopped = runs_of(workdir, recipe)
    assert stopped.info.status == "KILLED"
    stop_epoch, done = divmod(stop_at, 6)
    assert last_of(workdir, recipe, stopped.info.run_id)["global_step"] == stop_at
    resumed_log: list = []
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ended before the epoch ended.*")  # the loader is resumable
        fit(monkeypatch, config, *max_epochs, "--ckpt_path", "last", extra_callbacks=[BatchRecorder(resumed_log)])
    assert runs_of(workdir, recipe)[1].info.status == "FINISHED"

    # the resumed epoch trains the batches the stop left, with Lightning's batch index going on, then every later one
    assert stopped_log == straight_log[:stop_at]
    assert resumed_log == straight_log[stop_at:]
    assert [b[1] for b in in_epoch(resumed_log, stop_epoch)] == list(range(done, 6))

    a, b = last_of(workdir, recipe, straight.info.run_id), last_of(workdir, recipe, stopped.info.run_id)
    assert (a["epoch"], a["global_step"]) == (epochs - 1, 6 * epochs)
    assert_same_training_state(a, b)
    sa, sb = a["callbacks"]["RandomStates"], b["callbacks"]["RandomStates"]
    assert torch.equal(sa["torch"], sb["torch"]) and torch.equal(sa["numpy"]["keys"], sb["numpy"]["keys"])


@pytest.mark.slow
def test_a_hard_kill_loses_at_most_checkpoint_every_n_steps_and_resumes_exactly(workdir, monkeypatch):
    """``--checkpoint_every_n_steps 4``: last.ckpt at steps 4, 6 (epoch 0's validation), 8, 12 (epoch 1's
    validation; step 12 itself is the epoch's last batch, left to the validation's write). A crash after step 10
    leaves step 8's last.ckpt, in the middle of epoch 1; resumed, the run ends as the uninterrupted one."""
    recipe, args = "spiral_mlp", ["--trainer.max_epochs", "2", "--checkpoint_every_n_steps", "4"]
    straight_log: list = []
    fit(monkeypatch, recipe, *args, extra_callbacks=[BatchRecorder(straight_log)])
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(monkeypatch, recipe, *args, extra_callbacks=[CrashAtStep(10)])
    straight, crashed = runs_of(workdir, recipe)
    assert crashed.info.status == "FAILED"
    assert last_of(workdir, recipe, crashed.info.run_id)["global_step"] == 8  # 2 steps lost, not 4
    resumed_log: list = []
    fit(monkeypatch, recipe, *args, "--ckpt_path", "last", extra_callbacks=[BatchRecorder(resumed_log)])
    assert runs_of(workdir, recipe)[1].info.status == "FINISHED"
    assert resumed_log == straight_log[8:]
    a, b = last_of(workdir, recipe, straight.info.run_id), last_of(workdir, recipe, crashed.info.run_id)
    assert (a["epoch"], a["global_step"]) == (1, 12)
    assert_same_training_state(a, b)
    # the step checkpoints are Lightning's ModelCheckpoint (every_n_train_steps) keeping its own state
    assert sum(key.startswith("RunCheckpoint") and "every_n_steps" in key for key in a["callbacks"]) == 1


class SigtermToRankZeroAtStep(Callback):
    """Sends SIGTERM to rank 0's own process after global step ``step``, as a scheduler's ``kill <pid>`` would (for a
    fit in a subprocess: ``--trainer.callbacks+=<this class>``)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_resume_after_a_mid_epoch_sigterm_on_two_processes_equals_the_uninterrupted_run(tmp_path):
    """2-process DDP (gloo), the tabular recipe: each rank draws its shard of ClassBalancedSampler's draw; SIGTERM to
    rank 0 after step 8 (epoch 1, batch 1 of 6 per rank) stops both ranks there; the resumed pair ends bit-for-bit
    where the uninterrupted pair ends."""
    from tests.conftest import recipes_env, two_process_command
    from tests.preloaded_python import preloaded_run

    recipe = CONFIGS / "tabular_mlp.yaml"
    args = ["--trainer.max_epochs", "2", *LIMITS, "--mlflow_model", "false", "--system_metrics_interval", "0"]
    stop = {"class_path": "tests.checkpoints.test_exact_resume.SigtermToRankZeroAtStep", "init_args": {"step": 8}}

    def fit_pair(*extra: str) -> subprocess.CompletedProcess:
        command = two_process_command(tmp_path, "fit", recipe, *args, *extra)
        return preloaded_run(command, cwd=tmp_path, env=recipes_env(), timeout=420)  # rank 0 forked, rank 1 launched by it

    out = fit_pair()
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    out = fit_pair(f"--trainer.callbacks+={json.dumps(stop)}")
    assert out.returncode == 128 + signal.SIGTERM, out.stdout[-3000:] + out.stderr[-3000:]
    straight, stopped = runs_of(tmp_path, "tabular_mlp")
    assert stopped.info.status == "KILLED"
    assert last_of(tmp_path, "tabular_mlp", stopped.info.run_id)["global_step"] == 8
    out = fit_pair("--ckpt_path", "last")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "ended before the epoch ended" not in out.stdout + out.stderr  # the loader is resumable
    assert runs_of(tmp_path, "tabular_mlp")[1].info.status == "FINISHED"
    a, b = last_of(tmp_path, "tabular_mlp", straight.info.run_id), last_of(tmp_path, "tabular_mlp", stopped.info.run_id)
    assert (a["epoch"], a["global_step"]) == (1, 12)
    assert_same_training_state(a, b)
    # the resumed epoch's train metrics add both processes' batches before the stop (summed into rank 0's checkpoint)
    from tests.exact_resume_runs import logged_values

    logged = logged_values(tmp_path, stopped.info.run_id)
    assert logged["train/acc"] == logged_values(tmp_path, straight.info.run_id)["train/acc"]
    assert logged == logged_values(tmp_path, straight.info.run_id)
