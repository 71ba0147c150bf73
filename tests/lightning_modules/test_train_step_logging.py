"""What a task's training steps log: every metric name, step and value, pinned (issue 32, point 3).

``train/loss`` goes through ``self.log`` at every step (issue 54, item 8), not on the progress bar (Lightning reads a
progress-bar value back to the host after every batch); a run stopped after a batch logs that batch's own loss. These
tests pin what a short fit records: the loggers' calls (step, names, values), the callback metrics and progress-bar
values at each epoch's end (the epoch line prints the callback metrics), under gradient accumulation, max_steps and
a run stopped after a batch that was not read, a recipe's whole MLflow record (``lr/decay``, ``lr/no_decay``,
``doctor/grad_norm``, the epoch-level metrics) and its epoch lines. The last test shows that Lightning's bookkeeping
reads no logged value back to the host after an ordinary batch (a progress-bar ``train/loss`` would be read after
every batch: a host-device sync on ordinary batches on a GPU).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from recipes.doctor.read_steps import is_read_step
from recipes.cli import main
from tests.conftest import CONFIGS, mlflow_client, runs_of
from tests.lightning_modules.test_step_values import Recorder  # every log_metrics call: (step, {name: value})

pytestmark = pytest.mark.usefixtures("one_thread")


class EpochEnds(L.Callback):
    """The callback metrics and the progress-bar values at each training epoch's end (what the epoch line shows)."""

    def __init__(self) -> None:
        self.callback: list[dict[str, float]] = []
        self.bar: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.callback.append({k: round(float(v), 6) for k, v in trainer.callback_metrics.items()})
        self.bar.append({k: round(float(v), 6) for k, v in trainer.progress_bar_metrics.items()})


def rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=generator), torch.randint(0, 3, (n,), generator=generator)


CASES = {
    "plain": {},  # 7 batches of 16 (the last one 4): logging steps 2 and 5, the epoch's last batch 6
    "accumulate": {"accumulate_grad_batches": 2},  # logging only on the batches that step the optimizer
    "max_steps": {"max_steps": 9},  # the run stops in its second epoch
    "stopped": {},  # a callback stops the run in the batch-end hook of batch 3, a batch that was not read
}


class StopAfterBatch(L.Callback):
    """Asks the run to stop in the batch-end hook of one batch (as a signal or a callback does)."""

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.batch_idx:
            trainer.should_stop = True


def record_fit(case: str, *callbacks: L.Callback) -> tuple[list, EpochEnds, dict[str, float]]:
    """A 2-epoch fit of a small classifier: the loggers' calls, the epoch ends and the final logged metrics."""
    L.seed_everything(0)
    x, y = rows(100, 0)
    xv, yv = rows(40, 1)
    recorder, ends = Recorder(), EpochEnds()
    callbacks = (*callbacks, StopAfterBatch(3)) if case == "stopped" else callbacks
    trainer = L.Trainer(
        max_epochs=2, log_every_n_steps=3, logger=recorder, callbacks=[ends, *callbacks], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", deterministic=True,
        gradient_clip_val=1.0, **CASES[case],
    )
    trainer.fit(ClassificationModule(MLP(2, 3, [16]), 3), DataLoader(TensorDataset(x, y), batch_size=16),
                DataLoader(TensorDataset(xv, yv), batch_size=16))
    logged = [(step, {k: round(v, 6) for k, v in metrics.items()}) for step, metrics in recorder.logged]
    return logged, ends, {k: round(float(v), 6) for k, v in trainer.logged_metrics.items()}


def record_recipe() -> dict[str, list[tuple[int, float]]]:
    """A 2-epoch spiral recipe fit of 7 batches per epoch in the working directory: its MLflow metric histories
    (name -> [(step, value)])."""
    main(["fit", "-c", str(CONFIGS / "spiral_mlp.yaml"), "--trainer.max_epochs", "2",
          "--trainer.limit_train_batches", "7", "--trainer.log_every_n_steps", "3"])
    client = mlflow_client(Path.cwd())
    run = runs_of(Path.cwd(), "spiral_mlp")[-1]
    histories = {}
    for key in sorted(run.data.metrics):
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        histories[key] = [(step, round(value, 6)) for step, value in history]
    return histories


# captured from the code that still called self.log for train/loss (values rounded to 6 digits)
FITS = {
    "plain": {
        "logged": [
            (2, {"train/loss": 1.001107, "epoch": 0.0}),
            (5, {"train/loss": 1.18917, "epoch": 0.0}),
            (6, {"val/loss": 1.078477, "val/acc": 0.375, "val/f1": 0.269308, "val/auroc": 0.569333, "epoch": 0.0}),
            (6, {"train/acc": 0.3, "train/f1": 0.234418, "epoch": 0.0}),
            (8, {"train/loss": 1.123905, "epoch": 1.0}),
            (11, {"train/loss": 1.082037, "epoch": 1.0}),
            (13, {"val/loss": 1.080232, "val/acc": 0.375, "val/f1": 0.282878, "val/auroc": 0.550444, "epoch": 1.0}),
            (13, {"train/acc": 0.32, "train/f1": 0.250798, "epoch": 1.0}),
        ],
        "callback": [
            {"train/loss": 1.190308,
             "val/loss": 1.078477,
             "val/acc": 0.375,
             "val/f1": 0.269308,
             "val/auroc": 0.569333,
             "train/acc": 0.3,
             "train/f1": 0.234418},
            {"train/loss": 1.187322,
             "val/loss": 1.080232,
             "val/acc": 0.375,
             "val/f1": 0.282878,
             "val/auroc": 0.550444,
             "train/acc": 0.32,
             "train/f1": 0.250798},
        ],
        "bar": [
            {"val/loss": 1.078477,
             "val/acc": 0.375,
             "val/f1": 0.269308,
             "val/auroc": 0.569333},
            {"val/loss": 1.080232,
             "val/acc": 0.375,
             "val/f1": 0.282878,
             "val/auroc": 0.550444},
        ],
        "final": {"train/loss": 1.187322,
                  "val/loss": 1.080232,
                  "val/acc": 0.375,
                  "val/f1": 0.282878,
                  "val/auroc": 0.550444,
                  "train/acc": 0.32,
                  "train/f1": 0.250798},
    },
    "accumulate": {
        "logged": [
            (2, {"train/loss": 1.191036, "epoch": 0.0}),
            (3, {"val/loss": 1.07742, "val/acc": 0.375, "val/f1": 0.257778, "val/auroc": 0.575333, "epoch": 0.0}),
            (3, {"train/acc": 0.3, "train/f1": 0.234418, "epoch": 0.0}),
            (5, {"train/loss": 1.094853, "epoch": 1.0}),
            (7, {"val/loss": 1.078671, "val/acc": 0.4, "val/f1": 0.293651, "val/auroc": 0.557555, "epoch": 1.0}),
            (7, {"train/acc": 0.31, "train/f1": 0.242567, "epoch": 1.0}),
        ],
        "callback": [
            {"train/loss": 1.189086,
             "val/loss": 1.07742,
             "val/acc": 0.375,
             "val/f1": 0.257778,
             "val/auroc": 0.575333,
             "train/acc": 0.3,
             "train/f1": 0.234418},
            {"train/loss": 1.186631,
             "val/loss": 1.078671,
             "val/acc": 0.4,
             "val/f1": 0.293651,
             "val/auroc": 0.557555,
             "train/acc": 0.31,
             "train/f1": 0.242567},
        ],
        "bar": [
            {"val/loss": 1.07742, "val/acc": 0.375, "val/f1": 0.257778, "val/auroc": 0.575333},
            {"val/loss": 1.078671, "val/acc": 0.4, "val/f1": 0.293651, "val/auroc": 0.557555},
        ],
        "final": {"train/loss": 1.186631,
                  "val/loss": 1.078671,
                  "val/acc": 0.4,
                  "val/f1": 0.293651,
                  "val/auroc": 0.557555,
                  "train/acc": 0.31,
                  "train/f1": 0.242567},
    },
    "max_steps": {
        "logged": [
            (2, {"train/loss": 1.001107, "epoch": 0.0}),
            (5, {"train/loss": 1.18917, "epoch": 0.0}),
            (6, {"val/loss": 1.078477, "val/acc": 0.375, "val/f1": 0.269308, "val/auroc": 0.569333, "epoch": 0.0}),
            (6, {"train/acc": 0.3, "train/f1": 0.234418, "epoch": 0.0}),
            (8, {"train/loss": 1.123905, "epoch": 1.0}),
            (8, {"train/acc": 0.25, "train/f1": 0.194518, "epoch": 1.0}),
        ],
        "callback": [
            {"train/loss": 1.190308,
             "val/loss": 1.078477,
             "val/acc": 0.375,
             "val/f1": 0.269308,
             "val/auroc": 0.569333,
             "train/acc": 0.3,
             "train/f1": 0.234418},
            {"train/loss": 1.123905,
             "val/loss": 1.078477,
             "val/acc": 0.375,
             "val/f1": 0.269308,
             "val/auroc": 0.569333,
             "train/acc": 0.25,
             "train/f1": 0.194518},
        ],
        "bar": [
            {"val/loss": 1.078477,
             "val/acc": 0.375,
             "val/f1": 0.269308,
             "val/auroc": 0.569333},
            {"val/loss": 1.078477,
             "val/acc": 0.375,
             "val/f1": 0.269308,
             "val/auroc": 0.569333},
        ],
        "final": {"train/loss": 1.123905,
                  "val/loss": 1.078477,
                  "val/acc": 0.375,
                  "val/f1": 0.269308,
                  "val/auroc": 0.569333,
                  "train/acc": 0.25,
                  "train/f1": 0.194518},
    },
    "stopped": {
        "logged": [
            (2, {"train/loss": 1.001107, "epoch": 0.0}),
            (3, {"train/loss": 1.099628, "epoch": 0.0}),
            (3, {"val/loss": 1.077649, "val/acc": 0.375, "val/f1": 0.257778, "val/auroc": 0.575333, "epoch": 0.0}),
            (3, {"train/acc": 0.3125, "train/f1": 0.238095, "epoch": 0.0}),
        ],
        "callback": [
            {"train/loss": 1.099628,
             "val/loss": 1.077649,
             "val/acc": 0.375,
             "val/f1": 0.257778,
             "val/auroc": 0.575333,
             "train/acc": 0.3125,
             "train/f1": 0.238095},
        ],
        "bar": [
            {"val/loss": 1.077649,
             "val/acc": 0.375,
             "val/f1": 0.257778,
             "val/auroc": 0.575333},
        ],
        "final": {"train/loss": 1.099628,
                  "val/loss": 1.077649,
                  "val/acc": 0.375,
                  "val/f1": 0.257778,
                  "val/auroc": 0.575333,
                  "train/acc": 0.3125,
                  "train/f1": 0.238095},
    },
}
RECIPE = {
    "doctor/data_wait_fraction": [(7, 0.179481), (14, 0.081972)],
    "doctor/grad_norm": [(0, 1.081632)],
    "epoch": [(2, 0.0), (5, 0.0), (6, 0.0), (6, 0.0), (8, 1.0), (11, 1.0), (13, 1.0), (13, 1.0)],
    "lr/decay": [(2, 0.009856), (5, 0.007862), (8, 0.004453), (11, 0.001345)],
    "lr/no_decay": [(2, 0.009856), (5, 0.007862), (8, 0.004453), (11, 0.001345)],
    "train/acc": [(6, 0.540179), (13, 0.640625)],
    "train/f1": [(6, 0.53572), (13, 0.632703)],
    "train/loss": [(2, 0.913616), (5, 0.718073), (8, 0.66598), (11, 0.62854)],
    "val/acc": [(6, 0.581454), (13, 0.709273)],
    "val/auroc": [(6, 0.864539), (13, 0.904988)],
    "val/f1": [(6, 0.58065), (13, 0.706045)],
    "val/loss": [(6, 0.656657), (13, 0.560204)],
}
EPOCH_LINES = [
    ("epoch 1/2  step 7  lr/decay 0.007862  lr/no_decay 0.007862  train/acc 0.5402  train/f1 0.5357  train/loss "
     "0.6104  val/acc 0.5815  val/auroc 0.8645  val/f1 0.5806  val/loss 0.6567"),
    ("epoch 2/2  step 14  lr/decay 0.001345  lr/no_decay 0.001345  train/acc 0.6406  train/f1 0.6327  train/loss "
     "0.6169  val/acc 0.7093  val/auroc 0.905  val/f1 0.706  val/loss 0.5602"),
]


def close(record: Any, golden: Any) -> bool:
    """``record`` equals ``golden``: the same structure, steps and names, the values to 1e-5 (relative)."""
    if isinstance(golden, dict):
        return isinstance(record, dict) and list(record) == list(golden) and all(
            close(record[k], golden[k]) for k in golden)
    if isinstance(golden, (list, tuple)):
        return len(record) == len(golden) and all(close(r, g) for r, g in zip(record, golden))
    if isinstance(golden, float):
        return record == pytest.approx(golden, rel=1e-5, abs=1e-6)
    return record == golden


@pytest.mark.parametrize("case", list(CASES))
def test_a_short_fit_records_the_names_steps_and_values_self_log_did(case: str) -> None:
    logged, ends, final = record_fit(case)
    assert close(logged, FITS[case]["logged"]), logged
    assert close(ends.callback, FITS[case]["callback"]), ends.callback
    assert close(ends.bar, FITS[case]["bar"]), ends.bar
    assert close(final, FITS[case]["final"]), final


def test_a_recipe_records_the_same_metrics_and_epoch_lines(workdir: Path, capsys: pytest.CaptureFixture) -> None:
    histories = record_recipe()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch ")]
    assert list(histories) == list(RECIPE)
    for name, golden in RECIPE.items():
        assert [step for step, _ in histories[name]] == [step for step, _ in golden], name
        if name != "doctor/data_wait_fraction":  # a measured time
            assert close(histories[name], golden), (name, histories[name])
    assert lines == EPOCH_LINES


HOST_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__format__")


class LightningBookkeeping(L.Callback):
    """Opens a counting window after the task's batch-end hook of each ordinary training batch (Lightning's result
    bookkeeping of that batch runs then) and closes it at the next batch start or the epoch's end (the first
    callback: nothing else runs in between)."""

    def __init__(self) -> None:
        self.window: int | None = None
        self.ordinary: list[int] = []
        self.reads: list[tuple[int, str, str]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.window = None
        pl_module.ordinary_batch = not is_read_step(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.window = None

    def counting(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.window is not None:
                caller = traceback.extract_stack()[-2]
                self.reads.append((self.window, name, f"{Path(caller.filename).name}:{caller.lineno} {caller.name}"))
            return original(*args, **kwargs)

        return counted


@pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")
def test_ordinary_batches_leave_no_logged_value_for_lightning_to_read_back(monkeypatch: pytest.MonkeyPatch) -> None:
    window = LightningBookkeeping()

    class Watched(ClassificationModule):
        def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
            super().on_train_batch_end(outputs, batch, batch_idx)
            if self.ordinary_batch:
                window.window = batch_idx
                window.ordinary.append(batch_idx)

    for name in HOST_READS:
        monkeypatch.setattr(torch.Tensor, name, window.counting(name, getattr(torch.Tensor, name)))
    L.seed_everything(0)
    x, y = rows(100, 0)
    trainer = L.Trainer(
        max_epochs=2, log_every_n_steps=3, logger=Recorder(), callbacks=[window], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", deterministic=True,
        limit_val_batches=0,
    )
    trainer.fit(Watched(MLP(2, 3, [16]), 3), DataLoader(TensorDataset(x, y), batch_size=16))
    monkeypatch.undo()
    assert window.ordinary == [0, 1, 3, 4, 0, 2, 3, 5], window.ordinary  # logging steps 2, 5, 8, 11; last batches 6
    assert window.reads == [], window.reads
