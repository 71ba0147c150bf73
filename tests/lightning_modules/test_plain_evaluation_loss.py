"""val/loss and test/loss are the task's plain loss: label smoothing is in train/loss only (issue 31 point 5)."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule, RegressionModule

torch.set_num_threads(1)


def frozen_sgd(params):
    return torch.optim.SGD(params, lr=0.0)  # the weights stay as built: the losses can be computed by hand


def fitted(module, x, y, batch_size=4):
    """One epoch of fit (train and val on the same rows, lr 0), then test; the logged metrics."""
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch_size)
    trainer.fit(module, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=len(x)), val_dataloaders=loader)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    [tested] = trainer.test(module, dataloaders=loader, verbose=False)
    return metrics, tested


def linear(inputs: int, outputs: int) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(inputs, outputs)
    with torch.no_grad():
        layer.weight.mul_(3.0)  # confident logits: smoothing changes the loss a lot
    return layer


def test_a_smoothed_classifiers_val_and_test_loss_is_the_plain_cross_entropy_of_its_logits():
    torch.manual_seed(1)
    x = torch.randn(10, 4)
    net = linear(4, 3)
    logits = net(x).detach()
    y = logits.argmax(1)  # confident and mostly right: smoothing adds to the loss
    y[0] = (y[0] + 1) % 3
    plain = F.cross_entropy(logits, y).item()
    smoothed = F.cross_entropy(logits, y, label_smoothing=0.2).item()
    assert smoothed - plain > 0.1  # far enough apart for the checks below to tell them apart
    metrics, tested = fitted(ClassificationModule(net, num_classes=3, label_smoothing=0.2, optimizer=frozen_sgd), x, y)
    assert metrics["train/loss"] == pytest.approx(smoothed, rel=1e-5)  # training keeps the smoothing
    assert metrics["val/loss"] == pytest.approx(plain, rel=1e-5)  # batches of 4, 4, 2: weighted by samples
    assert tested["test/loss"] == pytest.approx(plain, rel=1e-5)


def test_class_weights_stay_in_the_evaluation_loss_only_the_smoothing_goes():
    torch.manual_seed(2)
    x = torch.randn(9, 4)
    w = [2.0, 1.0, 0.5]
    net = linear(4, 3)
    logits = net(x).detach()
    y = logits.argmax(1)
    plain = F.cross_entropy(logits, y, weight=torch.tensor(w)).item()
    smoothed = F.cross_entropy(logits, y, weight=torch.tensor(w), label_smoothing=0.3).item()
    module = ClassificationModule(net, num_classes=3, label_smoothing=0.3, class_weights=w, optimizer=frozen_sgd)
    metrics, tested = fitted(module, x, y)
    assert metrics["train/loss"] == pytest.approx(smoothed, rel=1e-5)
    assert metrics["val/loss"] == pytest.approx(plain, rel=1e-5)
    assert tested["test/loss"] == pytest.approx(plain, rel=1e-5)


@pytest.mark.parametrize("task", ["binary", "multilabel"])
def test_binary_and_multilabel_evaluation_loss_is_bce_of_the_hard_labels(task):
    torch.manual_seed(3)
    x = torch.randn(8, 4)
    width = 1 if task == "binary" else 3
    net = linear(4, width)
    logits = net(x).detach().squeeze(-1) if task == "binary" else net(x).detach()
    y = (logits > 0).long() if task == "binary" else (logits > 0).float()
    plain = F.binary_cross_entropy_with_logits(logits, y.float()).item()
    smoothed = F.binary_cross_entropy_with_logits(logits, y.float() * 0.8 + 0.1).item()
    module = ClassificationModule(net, num_classes=2 if task == "binary" else 3, task=task, label_smoothing=0.2,
                                  optimizer=frozen_sgd)
    metrics, tested = fitted(module, x, y)
    assert metrics["train/loss"] == pytest.approx(smoothed, rel=1e-5)
    assert metrics["val/loss"] == pytest.approx(plain, rel=1e-5)
    assert tested["test/loss"] == pytest.approx(plain, rel=1e-5)


def test_a_regression_without_training_only_terms_reports_the_same_loss_in_training_and_evaluation():
    torch.manual_seed(4)
    x, y = torch.randn(8, 4), torch.randn(8)
    net = linear(4, 1)
    expected = F.huber_loss(net(x).detach().squeeze(-1), y, delta=0.5).item()
    metrics, tested = fitted(RegressionModule(net, loss="huber", huber_delta=0.5, optimizer=frozen_sgd), x, y)
    assert metrics["train/loss"] == pytest.approx(expected, rel=1e-5)
    assert metrics["val/loss"] == pytest.approx(expected, rel=1e-5)
    assert tested["test/loss"] == pytest.approx(expected, rel=1e-5)
