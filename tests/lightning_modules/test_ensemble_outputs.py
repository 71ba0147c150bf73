"""A network returning k members' outputs ``(batch, k, width)`` (TabM): the tasks train every member (the training
loss is the mean of the members' losses) and evaluate and predict with the ensemble (issue 55, item 3)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules.classification import ClassificationModule
from lightning_modules.models.tabm import TabM
from lightning_modules.regression import RegressionModule

pytestmark = pytest.mark.usefixtures("one_thread")

N, K = 12, 3


class FixedMembers(nn.Module):
    """Sample i's members' outputs are ``table[i]``: the input is the sample's index."""

    def __init__(self, table: Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, x: Tensor) -> Tensor:
        return self.table[x.long().squeeze(-1)]


def indices() -> Tensor:
    return torch.arange(N, dtype=torch.float32).unsqueeze(-1)


def plain_trainer() -> L.Trainer:
    return L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)


def validate(task: L.LightningModule, targets: Tensor) -> dict[str, float]:
    loader = DataLoader(TensorDataset(indices(), targets), batch_size=5)  # batches of 5, 5, 2
    (metrics,) = plain_trainer().validate(task, loader, verbose=False)
    return metrics


def predict(task: L.LightningModule) -> Tensor:
    loader = DataLoader(TensorDataset(indices()), batch_size=5)
    return torch.cat(plain_trainer().predict(task, loader))


def training_loss(task: L.LightningModule, targets: Tensor) -> Tensor:
    task.train()
    return task.forward_batch((indices(), targets)).loss


# --- multiclass --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [{}, {"class_weights": [1.0, 2.0, 0.5, 3.0], "label_smoothing": 0.1}])
def test_multiclass_training_loss_is_the_mean_of_the_members_losses(options):
    torch.manual_seed(0)
    logits, labels = torch.randn(N, K, 4) * 2, torch.randint(0, 4, (N,))
    task = ClassificationModule(FixedMembers(logits), num_classes=4, **options)
    weight = torch.tensor(options["class_weights"]) if "class_weights" in options else None
    smoothing = options.get("label_smoothing", 0.0)
    members = [F.cross_entropy(logits[:, i], labels, weight=weight, label_smoothing=smoothing) for i in range(K)]
    loss = training_loss(task, labels)
    torch.testing.assert_close(loss, torch.stack(members).mean())
    loss.backward()  # every member's outputs get a gradient
    assert (task.model.table.grad.abs().sum(dim=(0, 2)) > 0).all()


@pytest.mark.parametrize("options", [{}, {"class_weights": [1.0, 2.0, 0.5, 3.0], "label_smoothing": 0.1}])
def test_multiclass_val_loss_is_the_ensembles_log_loss(options):
    torch.manual_seed(1)
    logits, labels = torch.randn(N, K, 4) * 2, torch.randint(0, 4, (N,))
    task = ClassificationModule(FixedMembers(logits), num_classes=4, **options)
    weight = torch.tensor(options["class_weights"]) if "class_weights" in options else None
    mean_probs = logits.softmax(-1).mean(1)
    metrics = validate(task, labels)
    expected = F.nll_loss(mean_probs.log(), labels, weight=weight)  # no smoothing in val/loss
    assert metrics["val/loss"] == pytest.approx(float(expected), rel=1e-5)
    assert metrics["val/acc"] == pytest.approx(float((mean_probs.argmax(-1) == labels).float().mean()))


def test_multiclass_predictions_are_the_mean_probabilities():
    torch.manual_seed(2)
    logits = torch.randn(N, K, 4) * 3
    task = ClassificationModule(FixedMembers(logits), num_classes=4)
    probs = predict(task)
    torch.testing.assert_close(probs, logits.softmax(-1).mean(1))
    torch.testing.assert_close(probs.sum(-1), torch.ones(N))


def test_members_averaged_in_probability_not_in_logits():
    # one sure member and one unsure one: the mean probability is not the softmax of the mean logit
    logits = torch.tensor([[[20.0, 0.0], [0.0, 0.0]]])
    task = ClassificationModule(FixedMembers(logits), num_classes=2).eval()
    probs = task.predict_step((torch.zeros(1, 1),), 0)
    torch.testing.assert_close(probs, torch.tensor([[0.75, 0.25]]), atol=1e-6, rtol=0)


def test_saturated_members_give_finite_logits():
    logits = torch.tensor([[[500.0, -500.0], [400.0, -400.0]]])
    for task in (ClassificationModule(FixedMembers(logits), num_classes=2),
                 ClassificationModule(FixedMembers(logits), num_classes=2, task="multilabel")):
        task.eval()
        assert torch.isfinite(task.logits(torch.zeros(1, 1))).all()


# --- binary and multilabel ---------------------------------------------------------------------------------------
def test_binary_member_outputs():
    torch.manual_seed(3)
    logits, labels = torch.randn(N, K, 1) * 2, torch.randint(0, 2, (N,))
    task = ClassificationModule(FixedMembers(logits), num_classes=2, task="binary", class_weights=[1.0, 3.0])
    pos_weight = torch.tensor([3.0])
    members = [F.binary_cross_entropy_with_logits(logits[:, i, 0], labels.float(), pos_weight=pos_weight)
               for i in range(K)]
    torch.testing.assert_close(training_loss(task, labels), torch.stack(members).mean())
    p = torch.sigmoid(logits[..., 0]).mean(1)
    expected = -(3.0 * labels * p.log() + (1 - labels) * (1 - p).log()).mean()
    assert validate(task, labels)["val/loss"] == pytest.approx(float(expected), rel=1e-5)
    torch.testing.assert_close(predict(task), p)


def test_multilabel_member_outputs():
    torch.manual_seed(4)
    logits, labels = torch.randn(N, K, 3) * 2, torch.randint(0, 2, (N, 3))
    task = ClassificationModule(FixedMembers(logits), num_classes=3, task="multilabel", label_smoothing=0.2)
    soft = labels.float() * 0.8 + 0.1
    members = [F.binary_cross_entropy_with_logits(logits[:, i], soft) for i in range(K)]
    torch.testing.assert_close(training_loss(task, labels), torch.stack(members).mean())
    p = torch.sigmoid(logits).mean(1)
    expected = F.binary_cross_entropy(p, labels.float())  # no smoothing in val/loss
    assert validate(task, labels)["val/loss"] == pytest.approx(float(expected), rel=1e-5)
    torch.testing.assert_close(predict(task), p)


def test_wrong_member_width_is_one_line():
    task = ClassificationModule(FixedMembers(torch.zeros(N, K, 5)), num_classes=4)
    with pytest.raises(ValueError, match=r"expects the network to output shape \(batch, k, 4\), got \(12, 3, 5\)"):
        task.logits(indices())


# --- regression --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("standardize", [False, True])
def test_regression_member_outputs(standardize):
    torch.manual_seed(5)
    raw, targets = torch.randn(N, K, 1), torch.randn(N) * 3 + 10
    task = RegressionModule(FixedMembers(raw), standardize_targets=standardize)
    mean, std = (10.0, 3.0) if standardize else (0.0, 1.0)
    task.target_mean.fill_(mean), task.target_std.fill_(std), task.target_stats_fitted.fill_(True)
    members = raw[..., 0] * std + mean  # in the original units
    per_member = [F.mse_loss((members[:, i] - mean) / std, (targets - mean) / std) for i in range(K)]
    torch.testing.assert_close(training_loss(task, targets), torch.stack(per_member).mean())
    ensemble = members.mean(1)
    metrics = validate(task, targets)
    assert metrics["val/rmse"] == pytest.approx(float(((ensemble - targets) ** 2).mean().sqrt()), rel=1e-5)
    expected_loss = F.mse_loss((ensemble - mean) / std, (targets - mean) / std)
    assert metrics["val/loss"] == pytest.approx(float(expected_loss), rel=1e-5)
    torch.testing.assert_close(predict(task), ensemble)


def test_regression_several_targets_member_outputs():
    torch.manual_seed(6)
    raw, targets = torch.randn(N, K, 2), torch.randn(N, 2)
    task = RegressionModule(FixedMembers(raw), out_features=2, loss="l1")
    per_member = [F.l1_loss(raw[:, i], targets) for i in range(K)]
    torch.testing.assert_close(training_loss(task, targets), torch.stack(per_member).mean())
    torch.testing.assert_close(predict(task), raw.mean(1))


def test_regression_wrong_member_width_is_one_line():
    task = RegressionModule(FixedMembers(torch.zeros(N, K, 2)))
    with pytest.raises(ValueError, match=r"output shape \(batch, k, 1\), got \(12, 3, 2\)"):
        task.predictions(indices())


# --- end to end --------------------------------------------------------------------------------------------------
class LossHistory(L.Callback):
    """Each training batch's loss."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def test_tabm_trains_in_a_classification_module_under_a_plain_trainer():
    torch.manual_seed(0)
    n = 256
    numeric = torch.randn(n, 2)
    one_hot = F.one_hot(torch.randint(0, 3, (n,)), 3).float()
    labels = ((numeric[:, 0] * numeric[:, 1] > 0).long() + one_hot[:, 0].long()) % 3
    data = TensorDataset(torch.cat([numeric, one_hot], dim=1), labels)
    model = TabM(5, 3, numeric_features=2, k=4, hidden_sizes=[32, 32], embedding="periodic", frequency_scale=0.1)
    task = ClassificationModule(model, num_classes=3, optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3))
    history = LossHistory()
    trainer = L.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[history])
    trainer.fit(task, DataLoader(data, batch_size=32, shuffle=True), DataLoader(data, batch_size=64))
    first, last = sum(history.losses[:4]) / 4, sum(history.losses[-4:]) / 4
    assert len(history.losses) == 16 and last < first
    assert torch.isfinite(torch.tensor(float(trainer.callback_metrics["val/loss"])))
    probs = torch.cat(trainer.predict(task, DataLoader(TensorDataset(data.tensors[0]), batch_size=100)))
    assert probs.shape == (n, 3)
    torch.testing.assert_close(probs.sum(-1), torch.ones(n))
