"""ImageFolderDataModule: folders to classes, seeded split, train-only statistics, augmentation, workers, errors."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import lightning
import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.base import split_indices
from datamodules.image_folder import ImageFolderDataModule, ImageFolderDataset, read_image
from lightning_modules import ClassificationModule
from lightning_modules.models.mlp import MLP
from tests.data_files import make_folder, save


def batches(loader, epochs: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [batch for _ in range(epochs) for batch in loader]


def same_batches(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


def samples(batch_list) -> list[tuple[int, bytes]]:
    """The (label, image bytes) of every sample in ``batch_list``, sorted: the batches' content, in any order."""
    return sorted((int(y), x.numpy().tobytes()) for xb, yb in batch_list for x, y in zip(xb, yb))


# --- folders, classes and the split ---------------------------------------------------------------------------
def test_class_names_labels_and_description_from_folders(tmp_path):
    rng = np.random.default_rng(0)
    pixels = lambda: rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)  # noqa: E731
    for name in ("dog", "cat", "bird"):  # created out of order
        save(tmp_path / name / "a.png", pixels())
    save(tmp_path / "cat" / "B.PNG", pixels())
    save(tmp_path / "cat" / "c.JPG", pixels())
    save(tmp_path / "cat" / "d.jpeg", pixels())
    save(tmp_path / "cat" / "nested" / "e.png", pixels())  # nested folders belong to their class
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    (tmp_path / "cat" / "._a.png").write_bytes(b"macOS resource fork, not an image")  # hidden: skipped
    save(tmp_path / ".ipynb_checkpoints" / "x.png", pixels())  # hidden folder: not a class
    (tmp_path / "README.txt").write_text("stray file at the root")

    dm = ImageFolderDataModule(str(tmp_path), image_size=(4, 6), channels=3)
    assert dm.class_names == ["bird", "cat", "dog"]
    assert dm.num_classes == 3 and dm.in_channels == 3 and dm.image_size == (4, 6) and dm.in_features == 72

    paths, labels = dm.load()
    names = [os.path.relpath(p, tmp_path) for p in paths]
    assert names == [
        "bird/a.png",
        "cat/B.PNG",
        "cat/a.png",
        "cat/c.JPG",
        "cat/d.jpeg",
        os.path.join("cat", "nested", "e.png"),
        "dog/a.png",
    ]
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 1, 1, 1, 1, 1, 2]


def test_split_sizes_add_up_are_stratified_and_seeded(tmp_path):
    make_folder(tmp_path, {"a": 10, "b": 20, "c": 30}, size=(4, 4))
    dm = ImageFolderDataModule(str(tmp_path), image_size=4, val_fraction=0.2, test_fraction=0.1, seed=0)
    dm.setup("fit")
    assert dm.split_sizes == {"train": 42, "val": 12, "test": 6}
    assert dm.class_counts == [7, 14, 21]
    per_class = {s: torch.bincount(dm.datasets[s].labels, minlength=3).tolist() for s in ("train", "val", "test")}
    assert per_class == {"train": [7, 14, 21], "val": [2, 4, 6], "test": [1, 2, 3]}
    all_paths = [p for s in ("train", "val", "test") for p in dm.datasets[s].paths]
    assert sorted(all_paths) == sorted(dm.load()[0])  # disjoint and complete
    # labels follow the folder of each file
    for split in ("train", "val", "test"):
        ds = dm.datasets[split]
        assert [dm.class_names[y] for y in ds.labels.tolist()] == [Path(p).parent.name for p in ds.paths]

    again = ImageFolderDataModule(str(tmp_path), image_size=4, val_fraction=0.2, test_fraction=0.1, seed=0)
    again.setup("fit")
    other = ImageFolderDataModule(str(tmp_path), image_size=4, val_fraction=0.2, test_fraction=0.1, seed=1)
    other.setup("fit")
    assert all(dm.datasets[s].paths == again.datasets[s].paths for s in ("train", "val", "test"))
    assert dm.datasets["val"].paths != other.datasets["val"].paths


# --- decoding and shapes --------------------------------------------------------------------------------------
@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("image_size, hw", [(7, (7, 7)), ((6, 10), (6, 10))])
@pytest.mark.parametrize("cache", [False, True])
def test_images_are_resized_to_channels_height_width(tmp_path, channels, image_size, hw, cache):
    rng = np.random.default_rng(1)
    for c in ("x", "y"):
        save(tmp_path / c / "rgb.png", rng.integers(0, 256, (13, 9, 3), dtype=np.uint8))  # tall
        save(tmp_path / c / "gray.jpg", rng.integers(0, 256, (5, 11), dtype=np.uint8))  # wide, grayscale
        save(tmp_path / c / "rgba.png", rng.integers(0, 256, (8, 3, 4), dtype=np.uint8))  # alpha
        save(tmp_path / c / "palette.png", rng.integers(0, 256, (4, 4, 3), dtype=np.uint8), mode="P")
    dm = ImageFolderDataModule(str(tmp_path), image_size=image_size, channels=channels, cache=cache,
                               val_fraction=0.25)
    dm.setup("fit")
    assert dm.in_features == channels * hw[0] * hw[1]
    for split in ("train", "val"):
        ds = dm.datasets[split]
        for i in range(len(ds)):
            x, y = ds[i]
            assert x.shape == (channels, *hw) and x.dtype == torch.float32 and torch.isfinite(x).all()
            assert y.dtype == torch.int64 and y.shape == ()
            # the pixels are Pillow's conversion and bilinear resize, normalized with the train statistics
            mode = "L" if channels == 1 else "RGB"
            with Image.open(ds.paths[i]) as image:
                expected = np.array(image.convert(mode).resize((hw[1], hw[0]), Image.Resampling.BILINEAR))
            expected = torch.from_numpy(expected.reshape(*hw, channels)).permute(2, 0, 1).float() / 255
            assert torch.allclose(x, (expected - dm.mean.view(-1, 1, 1)) / dm.std.view(-1, 1, 1), atol=1e-5)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (len(dm.datasets["train"]), channels, *hw) and y.dtype == torch.int64


# --- train-only statistics ------------------------------------------------------------------------------------
def test_normalization_statistics_come_from_the_train_images_only(tmp_path):
    counts, seed, val_fraction, test_fraction = {"a": 12, "b": 8}, 3, 0.25, 0.25
    labels = torch.tensor([0] * 12 + [1] * 8)
    parts = split_indices(20, val_fraction, test_fraction, seed, labels)
    held_out = set(parts["val"].tolist()) | set(parts["test"].tolist())
    rng = np.random.default_rng(0)
    train_pixels = []
    k = 0
    for name, n in counts.items():
        for i in range(n):
            if k in held_out:  # val/test images are bright, train images dark: any leak moves the mean
                pixels = rng.integers(200, 256, (6, 6, 3), dtype=np.uint8)
            else:
                pixels = rng.integers(0, 101, (6, 6, 3), dtype=np.uint8)
                pixels[..., 1] //= 2  # channels differ
                train_pixels.append(pixels)
            save(tmp_path / name / f"{i:02d}.png", pixels)
            k += 1
    dm = ImageFolderDataModule(str(tmp_path), image_size=6, val_fraction=val_fraction,
                               test_fraction=test_fraction, seed=seed)
    dm.setup("fit")
    train = np.stack(train_pixels).astype(np.float64) / 255  # (N, H, W, C)
    assert torch.allclose(dm.mean.double(), torch.from_numpy(train.mean(axis=(0, 1, 2))), atol=1e-6)
    assert torch.allclose(dm.std.double(), torch.from_numpy(train.std(axis=(0, 1, 2))), atol=1e-6)
    assert dm.mean.max() < 100 / 255
    assert dm.mean[1] < dm.mean[0]

    train_x = torch.stack([x for x, _ in dm.datasets["train"]])
    assert train_x.mean(dim=(0, 2, 3)).abs().max() < 1e-5
    assert (train_x.std(dim=(0, 2, 3), unbiased=False) - 1).abs().max() < 1e-4
    for split in ("val", "test"):  # normalized with the train statistics, not their own
        x = torch.stack([x for x, _ in dm.datasets[split]])
        assert x.mean(dim=(0, 2, 3)).min() > 2.0


def test_constant_channel_is_only_centred(tmp_path):
    for name, value in (("a", 10), ("b", 10)):
        for i in range(3):
            save(tmp_path / name / f"{i}.png", np.full((4, 4), value, dtype=np.uint8))
    dm = ImageFolderDataModule(str(tmp_path), image_size=4, channels=1, val_fraction=0.0)
    dm.setup("fit")
    assert dm.std.tolist() == [1.0]
    assert torch.equal(dm.datasets["train"][0][0], torch.zeros(1, 4, 4))


# --- augmentation ---------------------------------------------------------------------------------------------
def crops_and_flips(raw: torch.Tensor, padding: int) -> list[torch.Tensor]:
    """Every image that a crop of the zero-padded ``raw`` (float, [0, 1]) and an optional flip can produce."""
    h, w = raw.shape[-2:]
    padded = torch.zeros(raw.shape[0], h + 2 * padding, w + 2 * padding)
    padded[:, padding : padding + h, padding : padding + w] = raw
    out = []
    for top in range(2 * padding + 1):
        for left in range(2 * padding + 1):
            crop = padded[:, top : top + h, left : left + w]
            out += [crop, crop.flip(-1)]
    return out


def test_augmentation_changes_train_reads_only_and_keeps_shape(tmp_path):
    make_folder(tmp_path, {"a": 6, "b": 6, "c": 6}, size=(8, 8))
    kwargs = dict(image_size=8, val_fraction=0.25, test_fraction=0.25)
    dm = ImageFolderDataModule(str(tmp_path), augment=True, crop_padding=2, **kwargs)
    dm.setup("fit")
    torch.manual_seed(0)
    train = dm.datasets["train"]
    differs = []
    for i in range(len(train)):
        (a, ya), (b, yb) = train[i], train[i]
        assert a.shape == b.shape == (3, 8, 8) and ya == yb
        differs.append(not torch.equal(a, b))
        # each read is a crop of the black-padded image, maybe flipped, then normalized
        raw = train.raw(i).float() / 255
        mean, std = dm.mean.view(-1, 1, 1), dm.std.view(-1, 1, 1)
        candidates = [(c - mean) / std for c in crops_and_flips(raw, 2)]
        assert any(torch.allclose(a, c, atol=1e-6) for c in candidates)
    assert any(differs)
    for split in ("val", "test"):  # eval splits never augment
        ds = dm.datasets[split]
        assert not ds.augment
        assert all(torch.equal(ds[i][0], ds[i][0]) for i in range(len(ds)))

    plain = ImageFolderDataModule(str(tmp_path), augment=False, **kwargs)
    plain.setup("fit")
    for split in ("train", "val", "test"):
        ds = plain.datasets[split]
        assert all(torch.equal(ds[i][0], ds[i][0]) for i in range(len(ds)))


def test_flip_only_without_crop_padding(tmp_path):
    make_folder(tmp_path, {"a": 4, "b": 4}, size=(5, 7))
    dm = ImageFolderDataModule(str(tmp_path), image_size=(5, 7), augment=True, crop_padding=0, val_fraction=0.0)
    dm.setup("fit")
    train = dm.datasets["train"]
    plain = ImageFolderDataset(train.paths, train.labels, (5, 7), 3, dm.mean, dm.std)
    torch.manual_seed(1)
    flipped = 0
    for _ in range(5):
        for i in range(len(train)):
            x, reference = train[i][0], plain[i][0]
            assert torch.equal(x, reference) or torch.equal(x, reference.flip(-1))
            flipped += torch.equal(x, reference.flip(-1))
    assert 0 < flipped < 5 * len(train)


def test_augmented_batches_repeat_with_a_fixed_torch_seed(tmp_path):
    make_folder(tmp_path, {"a": 8, "b": 8}, size=(8, 8))
    dm = ImageFolderDataModule(str(tmp_path), image_size=8, augment=True, batch_size=4)
    dm.setup("fit")
    runs = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        runs.append(batches(dm.train_dataloader(), epochs=2))
    assert same_batches(runs[0], runs[1])
    assert not same_batches(runs[0], runs[2])


# --- workers --------------------------------------------------------------------------------------------------
def test_workers_give_the_same_batches_as_the_main_process(tmp_path):
    make_folder(tmp_path, {"a": 10, "b": 10, "c": 10}, size=(8, 8))
    kwargs = dict(image_size=8, batch_size=4, val_fraction=0.2, test_fraction=0.2)
    main = ImageFolderDataModule(str(tmp_path), num_workers=0, **kwargs)
    workers = ImageFolderDataModule(str(tmp_path), num_workers=2, **kwargs)
    main.setup("fit")
    workers.setup("fit")
    train_loader = workers.train_dataloader()
    assert train_loader.num_workers == 2 and train_loader.persistent_workers
    # two epochs through the same loaders: the second reuses the persistent workers
    # shuffling has its own generator (the loader's seeds only the workers), so every epoch matches
    expected, got = batches(main.train_dataloader(), 2), batches(train_loader, 2)
    assert same_batches(expected, got)
    first = len(train_loader)
    assert not same_batches(expected[:first], expected[first:])  # and the two epochs are shuffled differently
    for split in ("val", "test"):
        loader = workers.make_loader(workers.datasets[split], train=False)
        reference = batches(main.make_loader(main.datasets[split], train=False), 2)
        assert loader.persistent_workers and same_batches(reference, batches(loader, 2))


def test_augmented_batches_with_workers_repeat_across_runs(tmp_path):
    make_folder(tmp_path, {"a": 10, "b": 10}, size=(8, 8))

    def run(augment: bool) -> list:
        dm = ImageFolderDataModule(str(tmp_path), image_size=8, batch_size=4, augment=augment, num_workers=2)
        dm.setup("fit")
        torch.manual_seed(123)  # the worker seeds come from the loader's generator, not the global RNG
        return batches(dm.train_dataloader(), epochs=2)

    first, second = run(True), run(True)
    assert same_batches(first, second)
    assert not same_batches(first, run(False))


def test_dataset_pickles_for_spawned_workers(tmp_path):
    make_folder(tmp_path, {"a": 3, "b": 3}, size=(4, 4))
    for cache in (False, True):
        dm = ImageFolderDataModule(str(tmp_path), image_size=4, cache=cache, val_fraction=0.0)
        dm.setup("fit")
        ds = dm.datasets["train"]
        copy = pickle.loads(pickle.dumps(ds))
        assert all(torch.equal(ds[i][0], copy[i][0]) for i in range(len(ds)))


def test_cache_gives_the_same_data_as_reading_files(tmp_path):
    make_folder(tmp_path, {"a": 6, "b": 6}, size=(9, 7))
    kwargs = dict(image_size=(5, 6), val_fraction=0.25, test_fraction=0.25)
    plain = ImageFolderDataModule(str(tmp_path), **kwargs)
    cached = ImageFolderDataModule(str(tmp_path), cache=True, **kwargs)
    plain.setup("fit")
    cached.setup("fit")
    assert torch.equal(plain.mean, cached.mean) and torch.equal(plain.std, cached.std)
    for split in ("train", "val", "test"):
        assert cached.datasets[split].images is not None and plain.datasets[split].images is None
        assert cached.datasets[split].images.dtype == torch.uint8
        assert same_batches(batches(plain.make_loader(plain.datasets[split], False)),
                            batches(cached.make_loader(cached.datasets[split], False)))


# --- checkpoint state -----------------------------------------------------------------------------------------
def test_state_dict_round_trip_into_a_fresh_instance(tmp_path):
    make_folder(tmp_path, {"a": 8, "b": 8}, size=(6, 6))
    trained = ImageFolderDataModule(str(tmp_path), image_size=6, seed=0)
    trained.setup("fit")
    state = trained.state_dict()
    assert state["class_names"] == ["a", "b"] and len(state["mean"]) == len(state["std"]) == 3
    torch.save(state, tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # checkpoint-safe plain values

    # a fresh instance with another split would compute other statistics; the restored ones win
    fresh = ImageFolderDataModule(str(tmp_path), image_size=6, seed=1)
    fresh.load_state_dict(state)
    fresh.setup("fit")
    assert torch.equal(fresh.mean, trained.mean) and torch.equal(fresh.std, trained.std)
    assert fresh.state_dict() == trained.state_dict()
    assert torch.equal(fresh.datasets["val"].mean.flatten(), trained.mean)

    # Lightning restores a data module after its setup: the built datasets switch to the restored statistics
    late = ImageFolderDataModule(str(tmp_path), image_size=6, seed=1)
    late.setup("fit")
    assert not torch.equal(late.mean, trained.mean)
    late.load_state_dict(state)
    assert late.state_dict() == trained.state_dict()
    for ds in late.datasets.values():
        assert torch.equal(ds.mean.flatten(), trained.mean) and torch.equal(ds.std.flatten(), trained.std)

    with pytest.raises(ValueError, match=re.escape("trained on classes ['a', 'c']")):
        ImageFolderDataModule(str(tmp_path), image_size=6).load_state_dict({**state, "class_names": ["a", "c"]})
    with pytest.raises(ValueError, match="does not fit channels=1"):
        ImageFolderDataModule(str(tmp_path), image_size=6, channels=1).load_state_dict(state)


# --- errors before training -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"image_size": 0}, "image_size must be >= 1, got 0"),
        ({"image_size": (8, 0)}, re.escape("image_size must be >= 1, got (8, 0)")),
        ({"image_size": (8, 8, 8)}, "image_size must be an int or a \\(height, width\\) pair"),
        ({"crop_padding": -1}, "crop_padding must be >= 0, got -1"),
        ({"channels": 2}, "channels must be 1 \\(grayscale\\) or 3 \\(RGB\\), got 2"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
    ],
)
def test_bad_arguments_are_named(tmp_path, kwargs, match):
    make_folder(tmp_path, {"a": 2, "b": 2}, size=(4, 4))
    with pytest.raises(ValueError, match=match):
        ImageFolderDataModule(str(tmp_path), **kwargs)


def test_missing_root_is_named(tmp_path):
    missing = tmp_path / "no_such_folder"
    with pytest.raises(FileNotFoundError, match=re.escape(f"root folder '{missing}' does not exist")):
        ImageFolderDataModule(str(missing))
    (tmp_path / "file.png").write_bytes(b"x")
    with pytest.raises(ValueError, match="is not a folder"):
        ImageFolderDataModule(str(tmp_path / "file.png"))


def test_root_without_class_folders(tmp_path):
    save(tmp_path / "loose.png", np.zeros((4, 4, 3), dtype=np.uint8))  # images directly under root
    with pytest.raises(ValueError, match=re.escape(f"no class folders under '{tmp_path}'")):
        ImageFolderDataModule(str(tmp_path))


def test_a_single_class_is_refused(tmp_path):
    make_folder(tmp_path, {"only": 3}, size=(4, 4))
    with pytest.raises(ValueError, match=re.escape("found 1 class folder ('only')") + ".*at least 2"):
        ImageFolderDataModule(str(tmp_path))


def test_a_class_folder_without_images_is_named(tmp_path):
    make_folder(tmp_path, {"a": 3, "b": 3}, size=(4, 4))
    (tmp_path / "empty_class").mkdir()
    (tmp_path / "empty_class" / "notes.txt").write_text("no images here")
    dm = ImageFolderDataModule(str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"class folder '{tmp_path / 'empty_class'}' has no images")):
        dm.setup("fit")


@pytest.mark.parametrize("name", ["broken.png", "broken.JPG"])
def test_a_corrupt_image_is_named_before_training_and_left_untouched(tmp_path, name):
    make_folder(tmp_path, {"a": 3, "b": 3}, size=(4, 4))
    bad = tmp_path / "b" / name
    bad.write_bytes(b"this is not an image at all")
    before = (bad.read_bytes(), os.stat(bad).st_mtime_ns)
    dm = ImageFolderDataModule(str(tmp_path))
    with pytest.raises(ValueError, match=re.escape(f"cannot read image {bad}")):
        dm.setup("fit")
    assert (bad.read_bytes(), os.stat(bad).st_mtime_ns) == before


def test_a_truncated_jpeg_is_named_when_decoded(tmp_path):
    # Image.verify does not decode a JPEG, so a truncated one passes the up-front check; the train split is
    # decoded for the statistics (still before training), other splits name the file on their first read
    make_folder(tmp_path, {"a": 3, "b": 3}, size=(4, 4))
    good = save(tmp_path / "b" / "photo.jpg", np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8))
    data = good.read_bytes()
    good.write_bytes(data[: int(len(data) * 0.8)])
    before = good.read_bytes()
    with pytest.raises(ValueError, match=re.escape(f"cannot read image {good}") + ".*truncated"):
        ImageFolderDataModule(str(tmp_path), val_fraction=0.0).setup("fit")
    ds = ImageFolderDataset([str(good)], torch.tensor([1]), (4, 4), 3, torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match=re.escape(f"cannot read image {good}")):
        ds[0]
    assert good.read_bytes() == before


def test_read_image_returns_uint8_channels_first(tmp_path):
    path = save(tmp_path / "x.png", np.arange(24, dtype=np.uint8).reshape(2, 4, 3))
    image = read_image(str(path), (2, 4), 3)
    assert image.dtype == torch.uint8 and image.shape == (3, 2, 4)
    assert image[:, 0, 0].tolist() == [0, 1, 2] and image[:, 1, 3].tolist() == [21, 22, 23]


# --- training with a plain Trainer ----------------------------------------------------------------------------
@pytest.mark.slow
def test_plain_trainer_learns_an_easy_colour_task(tmp_path):
    rng = np.random.default_rng(0)
    colours = {"blue": (40, 60, 200), "green": (50, 190, 70), "red": (200, 50, 40)}
    for name, colour in colours.items():
        for i in range(30):
            pixels = np.clip(np.array(colour) + rng.normal(0, 40, (10, 12, 3)), 0, 255).astype(np.uint8)
            save(tmp_path / "data" / name / f"{i:02d}.{'png' if i % 2 else 'jpg'}", pixels)
    lightning.seed_everything(0, verbose=False)
    dm = ImageFolderDataModule(str(tmp_path / "data"), image_size=8, augment=True, crop_padding=1, batch_size=16)
    model = ClassificationModule(
        MLP(in_features=dm.in_features, out_features=dm.num_classes, hidden_sizes=[32]), num_classes=dm.num_classes
    )
    trainer = lightning.Trainer(
        max_epochs=5, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=1,
    )
    trainer.fit(model, datamodule=dm)
    metrics = trainer.validate(model, datamodule=dm, verbose=False)[0]
    assert metrics["val/acc"] > 0.9
    # Lightning stores the data module's state (class names, train statistics) in checkpoints
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    checkpoint = torch.load(tmp_path / "model.ckpt", weights_only=False)
    assert checkpoint["ImageFolderDataModule"] == dm.state_dict()
    assert checkpoint["ImageFolderDataModule"]["class_names"] == ["blue", "green", "red"]
