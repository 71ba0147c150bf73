"""Soft targets (batch, num_classes), as mixup and cutmix make them: a multiclass ClassificationModule learns from
them with the same loss as from class indices when they are one-hot, label smoothing and class weights included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules import ClassificationModule


def module(**kwargs) -> ClassificationModule:
    torch.manual_seed(0)
    return ClassificationModule(nn.Linear(6, 4), num_classes=4, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"label_smoothing": 0.1}, {"class_weights": [1.0, 2.0, 0.5, 3.0]},
     {"label_smoothing": 0.2, "class_weights": [1.0, 2.0, 0.5, 3.0]}],
    ids=["plain", "smoothing", "weights", "smoothing-and-weights"],
)
def test_a_one_hot_soft_target_gives_the_loss_and_weight_of_its_class_index(kwargs):
    task = module(**kwargs)
    inputs, labels = torch.randn(9, 6), torch.tensor([0, 1, 2, 3, 3, 2, 1, 0, 3])
    hard = task.forward_batch((inputs, labels))
    soft = task.forward_batch((inputs, F.one_hot(labels, 4).float()))
    assert torch.allclose(soft.loss, hard.loss, rtol=1e-6, atol=0), (soft.loss.item(), hard.loss.item())
    if "class_weights" in kwargs:  # the weighted mean's denominator: the batch's summed class weights
        assert soft.loss_weight.item() == pytest.approx(hard.loss_weight.item(), rel=1e-7) == 1 * 2 + 2 * 2 + 0.5 * 2 + 3 * 3
    # the evaluation loss (smoothing off) too
    assert torch.allclose(task.evaluation_loss(soft), task.evaluation_loss(hard), rtol=1e-6, atol=0)


def test_a_mixed_target_is_the_mix_of_the_two_losses_and_metrics_read_its_argmax():
    task = module(class_weights=[1.0, 2.0, 0.5, 3.0])
    inputs = torch.randn(4, 6)
    a, b = torch.tensor([0, 1, 2, 3]), torch.tensor([3, 2, 1, 0])
    mixed = 0.7 * F.one_hot(a, 4).float() + 0.3 * F.one_hot(b, 4).float()
    out = task.forward_batch((inputs, mixed))
    logits = task.logits(inputs)
    w = task.class_weights
    nll_a = F.cross_entropy(logits, a, weight=w, reduction="sum")
    nll_b = F.cross_entropy(logits, b, weight=w, reduction="sum")
    expected = (0.7 * nll_a + 0.3 * nll_b) / (0.7 * w[a].sum() + 0.3 * w[b].sum())
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    probabilities, targets = task.metric_inputs(out)
    assert targets.tolist() == a.tolist()  # train accuracy and F1 on the soft target's most likely class


def test_soft_targets_on_a_binary_task_are_refused_naming_the_shape():
    task = ClassificationModule(nn.Linear(6, 1), num_classes=2, task="binary")
    with pytest.raises(ValueError, match=r"soft targets of shape \(3, 2\).*task='multiclass'"):
        task.forward_batch((torch.randn(3, 6), torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])))
