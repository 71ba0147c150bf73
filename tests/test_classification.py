"""ClassificationModule: loss, metrics, checks against the data and the network, checkpoints in plain Lightning."""

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP


def quiet_trainer(**kwargs):
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(**{**defaults, **kwargs})


class FixedLogits(nn.Module):
    """Returns preset logits, whatever the input."""

    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(torch.as_tensor(logits, dtype=torch.float32))

    def forward(self, x):
        return self.logits


def test_multiclass_loss_matches_hand_computed_cross_entropy():
    logits = [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    module = ClassificationModule(FixedLogits(logits), num_classes=3)
    out = module.forward_batch((torch.zeros(2, 1), torch.tensor([0, 2])))
    l0 = -math.log(math.exp(2) / (math.exp(2) + 2))
    l1 = -math.log(1 / (math.e + 2))
    assert out.loss.item() == pytest.approx((l0 + l1) / 2, rel=1e-6)
    assert out.batch_size == 2


def test_label_smoothing_and_class_weights_match_torch():
    torch.manual_seed(0)
    logits = torch.randn(6, 3)
    y = torch.tensor([0, 1, 2, 2, 1, 0])
    w = [1.0, 2.0, 0.5]
    module = ClassificationModule(FixedLogits(logits), num_classes=3, label_smoothing=0.1, class_weights=w)
    expected = F.cross_entropy(logits, y, weight=torch.tensor(w), label_smoothing=0.1)
    assert module.forward_batch((torch.zeros(6, 1), y)).loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_binary_task_uses_one_logit_bce_and_pos_weight():
    logits = torch.tensor([[0.5], [-1.0], [2.0]])
    y = torch.tensor([1, 0, 1])
    module = ClassificationModule(FixedLogits(logits), num_classes=2, task="binary", class_weights=[1.0, 3.0])
    expected = F.binary_cross_entropy_with_logits(logits.squeeze(1), y.float(), pos_weight=torch.tensor([3.0]))
    assert module.forward_batch((torch.zeros(3, 1), y)).loss.item() == pytest.approx(expected.item(), rel=1e-6)
    smooth = ClassificationModule(FixedLogits(logits), num_classes=2, task="binary", label_smoothing=0.2)
    target = y.float() * 0.8 + 0.1
    expected = F.binary_cross_entropy_with_logits(logits.squeeze(1), target)
    assert smooth.forward_batch((torch.zeros(3, 1), y)).loss.item() == pytest.approx(expected.item(), rel=1e-6)
    probs = smooth.predict_step((torch.zeros(3, 1),), 0)
    assert torch.allclose(probs, torch.sigmoid(logits.squeeze(1)))


def test_metrics_per_stage_are_separate_and_named():
    module = ClassificationModule(FixedLogits([[3.0, 0.0], [3.0, 0.0], [0.0, 3.0], [0.0, 3.0]]), num_classes=2)
    module.val_metrics.update(torch.tensor([[3.0, 0.0], [3.0, 0.0], [0.0, 3.0], [0.0, 3.0]]), torch.tensor([0, 1, 1, 1]))
    values = {k: v.item() for k, v in module.val_metrics.compute().items()}
    assert values["val/acc"] == pytest.approx(0.75)
    # macro F1: class 0 P=1/2 R=1 -> 2/3; class 1 P=1 R=2/3 -> 0.8
    assert values["val/f1"] == pytest.approx((2 / 3 + 0.8) / 2, rel=1e-5)
    assert module.train_metrics["acc"] is not module.val_metrics["acc"]
    assert module.monitor == "val/acc" and module.monitor_mode == "max"


def test_wrong_network_width_is_named():
    module = ClassificationModule(MLP(2, 4, [8]), num_classes=3)
    with pytest.raises(ValueError, match=r"expects the network to output shape \(batch, 3\), got \(5, 4\)"):
        module.forward_batch((torch.randn(5, 2), torch.zeros(5).long()))


def test_num_classes_is_checked_against_the_data_at_setup():
    module = ClassificationModule(MLP(2, 4, [8]), num_classes=4)
    dm = SpiralDataModule(n_samples=200, n_classes=3)
    with pytest.raises(ValueError, match="SpiralDataModule has 3 classes but ClassificationModule has num_classes=4"):
        quiet_trainer(max_epochs=1).fit(module, dm)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_classes": 1}, "num_classes must be >= 2"),
        ({"num_classes": 3, "task": "binary"}, "needs num_classes=2"),
        ({"num_classes": 3, "label_smoothing": 1.0}, "label_smoothing"),
        ({"num_classes": 3, "class_weights": [1.0, 2.0]}, "2 values for 3 classes"),
        ({"num_classes": 2, "class_weights": [1.0, 0.0]}, "must be > 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClassificationModule(MLP(2, 3), **kwargs)


def test_plain_trainer_learns_the_spiral_and_checkpoint_round_trips(tmp_path):
    L.seed_everything(0)
    dm = SpiralDataModule(n_samples=600, batch_size=32)
    module = ClassificationModule(MLP(2, 3, [32, 32]), num_classes=3,
                                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer = quiet_trainer(max_epochs=15, deterministic=True)
    trainer.fit(module, dm)
    acc = trainer.validate(module, dm, verbose=False)[0]["val/acc"]
    assert acc >= 0.9
    path = tmp_path / "plain.ckpt"
    trainer.save_checkpoint(path)
    # a module built in Python keeps plain hyperparameters; the network is passed again when loading
    assert set(module.hparams) == {"num_classes", "task", "label_smoothing", "class_weights", "monitor", "monitor_mode"}
    loaded = ClassificationModule.load_from_checkpoint(path, model=MLP(2, 3, [32, 32]))
    x = dm.datasets["val"].tensors[0]
    module.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(module(x), loaded(x))
