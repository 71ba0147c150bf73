"""DigitsDataModule: stratified seeded split, global train-only pixel statistics, shapes, and a quick MLP fit."""

import functools

import lightning as L
import pytest
import torch

from datamodules.base import split_indices
from datamodules.digits import DigitsDataModule, load_digit_images, shift_images
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


def test_shift_images_moves_each_image_by_its_own_offset_and_fills_the_border():
    images = torch.arange(16.0).reshape(1, 1, 4, 4).repeat(200, 1, 1, 1)
    torch.manual_seed(0)
    shifted = shift_images(images, 1, fill=-9.0)
    torch.manual_seed(0)
    offsets = torch.randint(-1, 2, (200, 2)).tolist()
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1), value=-9.0)
    for i, (dy, dx) in enumerate(offsets):
        assert torch.equal(shifted[i, 0], padded[i, 0, 1 - dy : 5 - dy, 1 - dx : 5 - dx])
    assert {tuple(o) for o in offsets} == {(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
    down_right = offsets.index([1, 1])
    assert shifted[down_right, 0, 0].tolist() == [-9.0] * 4 and shifted[down_right, 0, 1, 1:].tolist() == [0, 1, 2]


@pytest.mark.parametrize("flatten", [False, True])
def test_max_shift_augments_train_batches_only_and_follows_the_seed(flatten):
    dm = DigitsDataModule(flatten=flatten, max_shift=1, batch_size=64)
    dm.setup("fit")
    plain = DigitsDataModule(flatten=flatten, batch_size=64)
    plain.setup("fit")
    for split in ("train", "val", "test"):  # the stored splits (digests, baselines) are not shifted
        assert torch.equal(dm.datasets[split].tensors[0], plain.datasets[split].tensors[0])
    assert torch.equal(next(iter(dm.val_dataloader()))[0], next(iter(plain.val_dataloader()))[0])

    def first_batch(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        return next(iter(dm.train_dataloader()))[0]

    x, x_again, other = first_batch(0), first_batch(0), first_batch(1)
    unshifted = next(iter(plain.train_dataloader()))[0]
    assert x.shape == unshifted.shape and torch.equal(x, x_again) and not torch.equal(x, other)
    assert not torch.equal(x, unshifted)
    blank = dm.standardizer.transform(torch.zeros(1)).item()
    assert dm.datasets["train"].fill == pytest.approx(blank)
    assert x.min().item() == pytest.approx(blank)  # borders moved in are blank pixels, nothing darker
    resident = DigitsDataModule(flatten=flatten, max_shift=1, batch_size=64, device_resident=True)
    resident.setup("fit")
    torch.manual_seed(0)
    assert torch.equal(next(iter(resident.train_dataloader()))[0], x)


def test_max_shift_out_of_range_is_an_error():
    with pytest.raises(ValueError, match=r"max_shift must be in \[0, 7\], got 8"):
        DigitsDataModule(max_shift=8)
