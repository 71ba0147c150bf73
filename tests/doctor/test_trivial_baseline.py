"""The doctor's ``baseline`` check (issue 55): a run worse than the trivial predictor, and accuracy monitored on a
skewed table, are findings; a run that beats it gets a note with both numbers."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule, RegressionModule
from lightning_modules.models import MLP
from recipes.doctor import TrivialBaselineCheck

pytestmark = [
    pytest.mark.filterwarnings("ignore::recipes.doctor.LoopDoctorWarning"),
    pytest.mark.usefixtures("one_thread"),
]


class SplitTensors(L.LightningDataModule):
    """Train and val tensors, exposed as ``datasets`` like the project's data modules."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, n_train: int) -> None:
        super().__init__()
        self.datasets = {"train": TensorDataset(x[:n_train], y[:n_train]), "val": TensorDataset(x[n_train:], y[n_train:])}

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["train"], batch_size=16)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["val"], batch_size=64)


def fit(module: L.LightningModule, data: L.LightningDataModule, epochs: int = 1) -> TrivialBaselineCheck:
    check = TrivialBaselineCheck()
    trainer = L.Trainer(
        max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[check],
    )
    trainer.fit(module, datamodule=data)
    return check


def skewed_table() -> tuple[torch.Tensor, torch.Tensor]:
    """200 rows, 90% class 0, with features that carry no signal."""
    generator = torch.Generator().manual_seed(0)
    y = (torch.rand(200, generator=generator) < 0.1).long()
    return torch.randn(200, 3, generator=generator), y


def test_accuracy_monitored_on_a_9_to_1_table_is_a_finding_and_the_trivial_accuracy_is_the_val_majority_share():
    x, y = skewed_table()
    module = ClassificationModule(MLP(3, 2, [8]), num_classes=2, monitor="val/acc")
    check = fit(module, SplitTensors(x, y, 150))
    majority = int(torch.bincount(y[:150]).argmax())
    assert majority == 0
    assert check.majority_share == pytest.approx(float((y[:150] == 0).float().mean()))
    assert check.trivial["val/acc"] == pytest.approx(float((y[150:] == majority).float().mean()))
    messages = [f.message for f in check.findings if f.check == "baseline"]
    assert any("the monitor is val/acc" in m and "--model.init_args.monitor val/loss" in m for m in messages)


def test_val_loss_monitored_on_the_same_table_is_no_monitor_finding():
    x, y = skewed_table()
    check = fit(ClassificationModule(MLP(3, 2, [8]), num_classes=2, monitor="val/loss"), SplitTensors(x, y, 150))
    assert not any("the monitor is" in f.message for f in check.findings)


class Constant(nn.Module):
    """A regression network whose prediction is far from every target."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor([100.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bias.expand(x.shape[0], 1)


def test_a_regression_worse_than_the_train_mean_is_a_finding_naming_both_rmses():
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(120, 2, generator=generator), torch.randn(120, generator=generator)
    module = RegressionModule(Constant(), optimizer=lambda params: torch.optim.SGD(params, lr=0.0))
    check = fit(module, SplitTensors(x, y, 90))
    trivial = float(((y[90:].double() - y[:90].double().mean()) ** 2).mean().sqrt())
    assert check.trivial["val/rmse"] == pytest.approx(trivial)
    [finding] = [f for f in check.findings if f.check == "baseline"]
    assert "val/rmse 100" in finding.message and f"({trivial:.4g} on the same rows, 2 standard errors" in finding.message


def test_a_classifier_that_learns_gets_a_note_not_a_finding():
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(300, 2, generator=generator)
    y = (x[:, 0] > 0).long()
    module = ClassificationModule(
        MLP(2, 2, [16]), num_classes=2, optimizer=lambda params: torch.optim.Adam(params, lr=0.05)
    )
    check = fit(module, SplitTensors(x, y, 200), epochs=5)
    assert not check.findings
    assert any(note.startswith("val/acc") and "majority class scores" in note for note in check.reporter.notes)
