"""A task behaves like a LightningModule to people who subclass it and attach their own callbacks and loggers (issue 54,
item 8): a plain ``lightning.Trainer`` with a user's callback and ``CSVLogger`` training ``ClassificationModule`` on
``SpiralDataModule``.
"""

from __future__ import annotations

import csv
import logging
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import Accuracy

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule, RegressionModule
from lightning_modules.models import MLP

pytestmark = pytest.mark.usefixtures("one_thread")


class ReadsTheLoss(L.Callback):
    """A user's callback: what ``callback_metrics["train/loss"]`` holds at each batch's end, and that batch's loss."""

    def __init__(self) -> None:
        self.seen: list[tuple[float | None, float]] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        value = trainer.callback_metrics.get("train/loss")
        self.seen.append((None if value is None else float(value), float(outputs["loss"])))


def fit(module: L.LightningModule, tmp_path: Path, **trainer_args: Any) -> tuple[L.Trainer, ReadsTheLoss, list[str]]:
    L.seed_everything(0)
    reader = ReadsTheLoss()
    trainer_args.setdefault("max_epochs", 2)
    trainer = L.Trainer(
        log_every_n_steps=3, logger=CSVLogger(tmp_path, name="run"), callbacks=[reader],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
        **trainer_args,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = SpiralDataModule(n_samples=300, batch_size=32)
        trainer.fit(module, datamodule=data)
        trainer.test(module, datamodule=data, verbose=False)
    return trainer, reader, [str(w.message) for w in caught]


def test_a_users_callback_and_csv_logger_see_every_batchs_loss_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    trainer, reader, messages = fit(ClassificationModule(MLP(2, 3, [16]), 3, label_smoothing=0.1), tmp_path)
    assert len(reader.seen) == 2 * trainer.num_training_batches
    assert [seen for seen, _ in reader.seen] == pytest.approx([loss for _, loss in reader.seen], rel=1e-6)
    log_dir = Path(trainer.logger.log_dir)
    with (log_dir / "metrics.csv").open() as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss")]
    steps = [int(row["step"]) for row in rows]
    assert steps == sorted(set(steps)) and len(steps) == trainer.global_step // 3  # one row per logged step
    hparams = yaml.safe_load((log_dir / "hparams.yaml").read_text())
    assert hparams["num_classes"] == 3 and hparams["label_smoothing"] == 0.1 and hparams["task"] == "multiclass"
    assert not [m for m in messages if "configure_callbacks" in m], messages
    assert "configure_callbacks" not in caplog.text  # Lightning's info when a callback of the task's replaces one


def test_a_subclass_loss_module_and_metrics_are_the_ones_used(tmp_path: Path) -> None:
    calls = []

    class CountingLoss(nn.CrossEntropyLoss):
        def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            calls.append(len(targets))
            return super().forward(logits, targets)

    class Weighted(ClassificationModule):
        def __init__(self) -> None:
            super().__init__(MLP(2, 3, [16]), 3)
            self.loss = CountingLoss(weight=torch.tensor([1.0, 2.0, 3.0]))
            self.metrics = MetricCollection({"top1": Accuracy(task="multiclass", num_classes=3)})

    module = Weighted()
    trainer, _, _ = fit(module, tmp_path, max_epochs=1)
    assert isinstance(module.loss, CountingLoss) and len(calls) >= trainer.num_training_batches
    columns = (Path(trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"train/top1", "val/top1", "test/top1"} <= set(columns) and "val/acc" not in columns, columns


def test_a_subclass_overriding_the_old_loss_method_still_works_with_one_warning(tmp_path: Path) -> None:
    class OldStyle(RegressionModule):
        def loss(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return (predictions - targets).abs().mean()

    with pytest.warns(DeprecationWarning, match="self.loss") as caught:
        module = OldStyle(MLP(2, 1, [8]), standardize_targets=False)
    assert len([w for w in caught if issubclass(w.category, DeprecationWarning)]) == 1
    assert len(str(caught[0].message).splitlines()) == 1
    batch = (torch.zeros(4, 2), torch.ones(4))
    out = module.forward_batch(batch)
    assert float(out.loss) == pytest.approx(float((module.predictions(batch[0]) - 1).abs().mean()))


def test_a_data_mismatch_message_reads_for_python_and_config_users(tmp_path: Path) -> None:
    module = ClassificationModule(MLP(2, 4, [8]), 4)
    with pytest.raises(ValueError, match=r"num_classes \(model\.init_args\.num_classes in a config\)"):
        L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, accelerator="cpu").fit(
            module, datamodule=SpiralDataModule(n_samples=90, n_classes=3))


def test_train_loss_steps_narrows_the_batches_that_log_train_loss(tmp_path: Path) -> None:
    """``train_loss_steps`` (what ``recipes fit`` sets to its read steps): only the batches it accepts go through
    ``self.log``; the callback metrics hold that batch's loss until the next one, the CSV rows are unchanged."""
    module = ClassificationModule(MLP(2, 3, [16]), 3)
    module.train_loss_steps = lambda trainer: (trainer.global_step + 1) % 3 == 0
    trainer, reader, _ = fit(module, tmp_path)
    logged = [i for i in range(len(reader.seen)) if (i + 1) % 3 == 0]
    for i, (seen, loss) in enumerate(reader.seen):
        held = max((j for j in logged if j <= i), default=None)
        assert seen == (None if held is None else pytest.approx(reader.seen[held][1], rel=1e-6)), i
    with (Path(trainer.logger.log_dir) / "metrics.csv").open() as f:
        steps = [int(row["step"]) for row in csv.DictReader(f) if row.get("train/loss")]
    assert steps == [i for i in logged if (i + 1) % 3 == 0]


def test_recipes_fit_logs_train_loss_on_the_steps_it_reads(workdir: Path) -> None:
    """The recipe's CLI hands the task its read steps (``recipes.doctor.read_steps.is_read_step``)."""
    from recipes.doctor.read_steps import is_read_step
    from recipes.run.recipes_cli import RecipesCLI
    from tests.conftest import REPO

    cli = RecipesCLI(["fit", "-c", str(REPO / "configs/spiral_mlp.yaml"), "--trainer.fast_dev_run", "1"])
    assert cli.model.train_loss_steps is is_read_step
