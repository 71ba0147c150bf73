"""A run stopped and resumed with ``--ckpt_path last`` ends exactly where an uninterrupted run does.

Epoch boundary (a crash or kill after an epoch's ``last.ckpt``): parameters, optimizer state and LR schedule are
bit-for-bit those of the uninterrupted run (CPU, ``deterministic: true``), for the spiral recipe (plain shuffling),
the tabular one (dropout + ClassBalancedSampler) and the text one (dropout + EpochRandomSampler + length buckets).

Mid-epoch (SIGTERM / Ctrl+C save ``last.ckpt`` after the current batch): not exact, and the test pins down what
Lightning 2.6 does, as the README documents it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import recipes.cli as cli
from tests.conftest import CONFIGS, REPO, runs_of

LIMITS = ["--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2"]


class CrashAtEpochStart(Callback):
    """Dies at the start of epoch ``epoch``, after the previous epoch wrote its checkpoints."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.epoch:
            raise RuntimeError(f"simulated crash at the start of epoch {self.epoch}")


class SigtermAtStep(Callback):
    """Lightning's SIGTERM path (stop after this batch, RunContinuity saves last.ckpt) at a global step."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            trainer._signal_connector.received_sigterm = True


class BatchRecorder(Callback):
    """(epoch, batch_idx, first labels of the batch) of every training batch."""

    def __init__(self, records: list) -> None:
        self.records = records

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        labels = batch["labels"] if isinstance(batch, dict) else batch[1]
        self.records.append((trainer.current_epoch, batch_idx, tuple(labels[:8].tolist())))


def fit(monkeypatch, recipe: str, *args: str, extra_callbacks: list | None = None) -> None:
    original = cli.RecipesCLI.default_callbacks
    if extra_callbacks:
        monkeypatch.setattr(
            cli.RecipesCLI, "default_callbacks", lambda self, cfg: original(self, cfg) + list(extra_callbacks)
        )
    try:
        cli.main(["fit", "-c", str(CONFIGS / f"{recipe}.yaml"), *LIMITS, *args])
    finally:
        monkeypatch.setattr(cli.RecipesCLI, "default_callbacks", original)


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


@pytest.mark.slow
@pytest.mark.parametrize(
    "recipe, epochs, crash_at",
    [("spiral_mlp", 4, 2), ("tabular_mlp", 3, 1), ("text_transformer", 3, 1)],
    ids=["spiral", "tabular-dropout-balanced-sampler", "text-dropout-length-buckets"],
)
def test_resume_at_an_epoch_boundary_equals_the_uninterrupted_run(workdir, monkeypatch, recipe, epochs, crash_at):
    if (REPO / "data").is_dir():
        (workdir / "data").symlink_to(REPO / "data")
    max_epochs = ["--trainer.max_epochs", str(epochs)]
    fit(monkeypatch, recipe, *max_epochs)
    with pytest.raises(RuntimeError, match="simulated crash"):
        fit(monkeypatch, recipe, *max_epochs, extra_callbacks=[CrashAtEpochStart(crash_at)])
    straight, crashed = runs_of(workdir, recipe)
    assert crashed.info.status == "FAILED"
    assert last_of(workdir, recipe, crashed.info.run_id)["epoch"] == crash_at - 1
    fit(monkeypatch, recipe, *max_epochs, "--ckpt_path", "last")  # the newest last.ckpt: the crashed run's
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


@pytest.mark.slow
def test_resume_after_a_mid_epoch_sigterm_replays_the_start_of_the_epoch(workdir, monkeypatch):
    """What Lightning 2.6 does with a plain (not stateful) DataLoader, pinned: the resumed epoch restarts the
    epoch's data order from its first batch while ``batch_idx`` and the step count continue, so it runs the
    *first* N-k batches of the epoch's order again (k = batches done before the stop): batches 0..k-1 twice, the
    last k not at all. Step counts, epochs and the LR schedule still end where the uninterrupted run ends."""
    recipe, max_epochs = "spiral_mlp", ["--trainer.max_epochs", "3"]
    straight_log: list = []
    fit(monkeypatch, recipe, *max_epochs, extra_callbacks=[BatchRecorder(straight_log)])
    stopped_log: list = []
    with pytest.raises(SystemExit) as exc:
        fit(monkeypatch, recipe, *max_epochs, extra_callbacks=[SigtermAtStep(8), BatchRecorder(stopped_log)])
    assert exc.value.code == 143
    resumed_log: list = []
    with pytest.warns(UserWarning, match="resuming from a checkpoint that ended before the epoch ended"):
        fit(monkeypatch, recipe, *max_epochs, "--ckpt_path", "last", extra_callbacks=[BatchRecorder(resumed_log)])
    straight, stopped = runs_of(workdir, recipe)
    assert stopped.info.status == "FINISHED"

    epoch1 = [b for b in straight_log if b[0] == 1]  # 6 batches: global steps 6..11
    assert [b[1] for b in stopped_log if b[0] == 1] == [0, 1]  # stopped after step 8 = epoch 1, batch 1
    resumed_epoch1 = [b for b in resumed_log if b[0] == 1]
    assert [b[1] for b in resumed_epoch1] == [2, 3, 4, 5]  # batch_idx continues ...
    assert [b[2] for b in resumed_epoch1] == [b[2] for b in epoch1[:4]]  # ... but the data restarts at batch 0
    assert [b for b in resumed_log if b[0] == 2] == [b for b in straight_log if b[0] == 2]  # later epochs: same data

    a, b = last_of(workdir, recipe, straight.info.run_id), last_of(workdir, recipe, stopped.info.run_id)
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"]) == (2, 18)
    assert a["lr_schedulers"] == b["lr_schedulers"]
    assert not torch.equal(a["state_dict"]["model.net.0.weight"], b["state_dict"]["model.net.0.weight"])
