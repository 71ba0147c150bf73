"""DigitsDataModule: stratified seeded split, global train-only pixel statistics, shapes, and a quick MLP fit."""

import functools

import lightning as L
import pytest
import torch

from datamodules.base import split_indices
from datamodules.digits import DigitsDataModule, load_digit_images
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP


@pytest.fixture(scope="module")
def raw():
    return load_digit_images()


def test_raw_data_is_the_bundled_digits(raw):
    images, labels = raw
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.float32
    assert labels.shape == (1797,) and labels.dtype == torch.int64
    assert images.min().item() == 0.0 and images.max().item() == 16.0
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]


def test_split_sizes_add_up_and_are_stratified(raw):
    _, labels = raw
    dm = DigitsDataModule()
    assert (dm.num_classes, dm.in_features, dm.in_channels, dm.image_size) == (10, 64, 1, 8)
    assert dm.class_names == [str(d) for d in range(10)]
    dm.setup("fit")
    sizes = dm.split_sizes
    assert sum(sizes.values()) == 1797
    assert sizes == {"train": 1259, "val": 269, "test": 269}
    per_class = torch.bincount(labels, minlength=10).double()
    for split, fraction in (("train", 0.70), ("val", 0.15), ("test", 0.15)):
        counts = torch.bincount(dm.datasets[split].tensors[1], minlength=10).double()
        assert (counts - per_class * fraction).abs().max().item() <= 1.0, split
    assert dm.class_counts == torch.bincount(dm.datasets["train"].tensors[1], minlength=10).tolist()


def test_split_is_deterministic_for_a_seed_and_differs_for_another():
    a, b, c = DigitsDataModule(seed=0), DigitsDataModule(seed=0), DigitsDataModule(seed=1)
    for dm in (a, b, c):
        dm.setup("fit")
    for split in ("train", "val", "test"):
        assert torch.equal(a.datasets[split].tensors[0], b.datasets[split].tensors[0])
        assert torch.equal(a.datasets[split].tensors[1], b.datasets[split].tensors[1])
    assert not torch.equal(a.datasets["train"].tensors[1], c.datasets["train"].tensors[1])


def test_pixels_are_standardized_with_one_global_train_mean_and_std(raw):
    images, labels = raw
    dm = DigitsDataModule(seed=3)
    dm.setup("fit")
    idx = split_indices(1797, 0.15, 0.15, seed=3, labels=labels)
    train_raw, val_raw = images[idx["train"]], images[idx["val"]]
    # one scalar mean and std over all train pixels, equal to the raw train pixels' and not the whole set's
    assert dm.standardizer.mean.numel() == 1 and dm.standardizer.std.numel() == 1
    assert dm.standardizer.mean.item() == pytest.approx(train_raw.double().mean().item(), abs=1e-5)
    assert dm.standardizer.std.item() == pytest.approx(train_raw.double().std(unbiased=False).item(), abs=1e-5)
    assert abs(dm.standardizer.mean.item() - images.double().mean().item()) > 1e-3
    train = dm.datasets["train"].tensors[0]
    assert abs(train.mean().item()) < 1e-5 and train.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-5)
    assert torch.equal(dm.datasets["train"].tensors[1], labels[idx["train"]])
    expected_val = (val_raw - train_raw.mean()) / train_raw.std(unbiased=False)
    assert torch.allclose(dm.datasets["val"].tensors[0], expected_val, atol=1e-5)
    assert torch.isfinite(train).all()  # constant border pixels do not blow up


@pytest.mark.parametrize("flatten, shape", [(False, (1, 8, 8)), (True, (64,))])
def test_shapes(flatten, shape):
    dm = DigitsDataModule(flatten=flatten, batch_size=32)
    dm.setup("fit")
    for split, n in dm.split_sizes.items():
        x, y = dm.datasets[split].tensors
        assert x.shape == (n, *shape) and x.dtype == torch.float32 and y.shape == (n,) and y.dtype == torch.int64
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (32, *shape) and y.shape == (32,)
    assert sum(len(b[1]) for b in dm.val_dataloader()) == 269


def test_mlp_learns_the_digits():
    L.seed_everything(0, verbose=False)
    dm = DigitsDataModule(flatten=True, batch_size=64, seed=0)
    module = ClassificationModule(
        MLP(64, 10, [64]), num_classes=10, optimizer=functools.partial(torch.optim.AdamW, lr=1e-2)
    )
    trainer = L.Trainer(
        max_epochs=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=dm)
    accuracy = trainer.callback_metrics["val/acc"].item()
    assert accuracy > 0.8, accuracy
