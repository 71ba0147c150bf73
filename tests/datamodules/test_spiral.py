import math

import pytest
import torch

from datamodules import SpiralDataModule
from datamodules.spiral import make_spiral


def test_make_spiral_shapes_balance_and_seed():
    x, y = make_spiral(2000, 3, 0.2, seed=0)
    assert x.shape == (2000, 2) and x.dtype == torch.float32
    assert y.dtype == torch.int64
    assert torch.bincount(y).tolist() == [667, 667, 666]
    # radius runs from 0 to 1 on each arm (noise only perturbs the angle)
    radius = x.norm(dim=1)
    assert radius.max().item() == pytest.approx(1.0, abs=1e-5)
    assert radius.min().item() == pytest.approx(0.0, abs=1e-6)
    x2, y2 = make_spiral(2000, 3, 0.2, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = make_spiral(2000, 3, 0.2, seed=1)
    assert not torch.equal(x, x3)


def test_arms_are_rotated_copies_without_noise():
    x, y = make_spiral(300, 3, 0.0, seed=0)
    arm0, arm1 = x[y == 0], x[y == 1]
    angle = 2 * math.pi / 3
    # rotating arm 0 by -120 degrees (sin/cos convention of make_spiral) gives arm 1
    rot = torch.tensor([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    assert torch.allclose(arm0 @ rot, arm1, atol=1e-5)


def test_datamodule_description_and_split_sizes():
    dm = SpiralDataModule(n_samples=1000, n_classes=4, val_fraction=0.2, test_fraction=0.1)
    assert dm.num_classes == 4 and dm.in_features == 2
    dm.setup("fit")
    sizes = dm.split_sizes
    assert sum(sizes.values()) == 1000
    assert sizes == {"train": 700, "val": 200, "test": 100}
    assert sum(dm.class_counts) == 700 and len(dm.class_counts) == 4


def test_standardization_uses_train_statistics():
    dm = SpiralDataModule(n_samples=600, seed=3)
    dm.setup("fit")
    train_x = dm.datasets["train"].tensors[0]
    assert train_x.mean(0).abs().max().item() < 1e-5
    assert train_x.std(0, unbiased=False).sub(1).abs().max().item() < 1e-4
    val_x = dm.datasets["val"].tensors[0]
    # the val split is transformed with the train statistics, so it is not exactly standardized itself
    assert val_x.mean(0).abs().max().item() > 1e-4


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"n_classes": 1}, "n_classes must be >= 2"),
        ({"batch_size": -5}, "batch_size must be >= 1"),
        ({"noise": -0.1}, "noise must be >= 0"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "leave samples for training"),
        ({"n_samples": 2, "n_classes": 3}, "n_samples"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SpiralDataModule(**kwargs)
