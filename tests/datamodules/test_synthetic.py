import pytest
import torch

from datamodules import SpiralDataModule, SyntheticDataModule
from datamodules.synthetic import make_blobs


def test_make_blobs_shapes_balance_seed():
    x, y = make_blobs(1000, 784, 10, separation=3.0, seed=0)
    assert x.shape == (1000, 784) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and torch.bincount(y).tolist() == [100] * 10
    x2, y2 = make_blobs(1000, 784, 10, separation=3.0, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, make_blobs(1000, 784, 10, separation=3.0, seed=1)[0])


def test_blobs_are_learnable_but_not_trivial():
    x, y = make_blobs(2000, 20, 4, separation=3.0, seed=0)
    centres = torch.stack([x[y == c].mean(0) for c in range(4)])
    nearest = torch.cdist(x, centres).argmin(1)
    acc = (nearest == y).float().mean().item()
    assert 0.6 < acc < 1.0  # nearest-centre accuracy: clearly above chance (0.25), not perfect


def test_datamodule_vectors_and_images():
    dm = SyntheticDataModule(n_samples=500, in_features=784, n_classes=10, batch_size=64, val_fraction=0.2)
    assert dm.num_classes == 10 and dm.in_features == 784
    dm.setup("fit")
    assert dm.split_sizes == {"train": 400, "val": 100, "test": 0}
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, 784) and y.shape == (64,)
    images = SyntheticDataModule(n_samples=200, n_classes=10, image_shape=[3, 32, 32], batch_size=16)
    assert images.in_features == 3 * 32 * 32
    images.setup("fit")
    x, _ = next(iter(images.train_dataloader()))
    assert x.shape == (16, 3, 32, 32)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_classes": 1}, "n_classes must be >= 2"),
        ({"n_samples": 3, "n_classes": 4}, "must be >= n_classes"),
        ({"image_shape": [3, 0, 32]}, "image_shape"),
        ({"in_features": 0}, "in_features"),
        ({"separation": -1.0}, "separation"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SyntheticDataModule(**kwargs)


@pytest.mark.parametrize("cls", [SpiralDataModule, SyntheticDataModule])
def test_device_resident_gives_the_same_batches_on_cpu(cls):
    kwargs = {"n_samples": 300, "batch_size": 32, "seed": 3, "val_fraction": 0.3}
    if cls is SyntheticDataModule:
        kwargs.update(in_features=8, n_classes=3)
    plain, resident = cls(**kwargs), cls(**kwargs, device_resident=True, num_workers=2, pin_memory=True)
    loader = resident.train_dataloader()
    assert loader.num_workers == 0 and not loader.pin_memory  # the resident path stays in the main process
    for split in ("train_dataloader", "val_dataloader"):
        batches_a = list(getattr(plain, split)())
        batches_b = list(getattr(resident, split)())
        assert len(batches_a) == len(batches_b) > 1
        for (xa, ya), (xb, yb) in zip(batches_a, batches_b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_resident_batches_are_on_the_gpu():
    dm = SyntheticDataModule(n_samples=300, in_features=8, n_classes=3, batch_size=32, device_resident=True)
    dm.setup("fit")

    class FakeStrategy:
        root_device = torch.device("cuda", 0)

    class FakeTrainer:
        strategy = FakeStrategy()
        current_epoch = 0

    dm.trainer = FakeTrainer()  # type: ignore[assignment]
    x, y = next(iter(dm.train_dataloader()))
    assert x.device.type == "cuda" and y.device.type == "cuda"
    plain = SyntheticDataModule(n_samples=300, in_features=8, n_classes=3, batch_size=32)
    xp, yp = next(iter(plain.train_dataloader()))
    assert torch.equal(x.cpu(), xp) and torch.equal(y.cpu(), yp)
