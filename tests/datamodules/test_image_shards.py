"""ImageFolderDataModule on image shards (``recipes pack``'s Parquet files): the folder's classes, split, pixels,
statistics, predictions, checkpoint state and training, from the shards' rows; shards that are not image shards."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import lightning
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from datamodules.image_files import EncodedImage
from datamodules.image_folder import ImageFolderDataModule
from datamodules.image_folder_dataset import ImageFolderDataset
from lightning_modules import ClassificationModule
from lightning_modules.models import ConvNet
from recipes.cli import main
from tests.data_files import make_folder, save

SPLITS = ("train", "val", "test")


def image_folder(root: Path) -> Path:
    """3 classes x 8 PNGs of 8x8 pixels (``ant`` darker, ``dog`` brighter: learnable), a JPEG, a grayscale PNG of
    another size and a nested folder."""
    make_folder(root, {"cat": 8, "dog": 8, "ant": 8}, size=(8, 8))
    rng = np.random.default_rng(1)
    for i in range(8):
        save(root / "ant" / f"{i:02d}.png", rng.integers(0, 100, (8, 8, 3), dtype=np.uint8))
        save(root / "dog" / f"{i:02d}.png", rng.integers(150, 256, (8, 8, 3), dtype=np.uint8))
    save(root / "dog" / "photo.JPG", rng.integers(0, 256, (12, 10, 3), dtype=np.uint8))
    save(root / "cat" / "nested" / "grey.png", rng.integers(0, 256, (6, 9), dtype=np.uint8))
    return root


def pack(folder: Path, out: Path, *args: str) -> Path:
    with pytest.raises(SystemExit) as end:
        main(["pack", str(folder), str(out), *args])
    assert end.value.code == 0
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    """(image folder, its shards: several, of a few images each)."""
    root = tmp_path_factory.mktemp("shards")
    folder = image_folder(root / "images")
    shards = pack(folder, root / "shards", "--shard_mb", "0.002", "--row_group_size", "3")
    assert len(list(shards.glob("*.parquet"))) >= 3
    return folder, shards


def split_paths(dm: ImageFolderDataModule, folder: Path | None) -> dict[str, list[str]]:
    """Each split's samples by path (relative to ``folder`` for a folder's module)."""
    def name(number: int) -> str:
        path = dm.sample_paths[number]
        return path if folder is None else os.path.relpath(path, folder).replace(os.sep, "/")
    return {split: [name(int(i)) for i in dm.split_rows[split]] for split in SPLITS}


def first_batches(dm: ImageFolderDataModule, count: int = 2) -> dict[str, list]:
    torch.manual_seed(0)  # the augmentation's draws
    loaders = {"train": dm.train_dataloader(), "val": dm.val_dataloader(), "test": dm.test_dataloader()}
    return {split: [batch for _, batch in zip(range(count), loader)] for split, loader in loaders.items()}


@pytest.mark.parametrize("settings", [
    dict(image_size=8, channels=3),
    dict(image_size=(5, 7), channels=1, cache=True),
    dict(image_size=6, channels=3, augment=True, crop_padding=2, seed=3),
])
def test_shards_give_the_folders_classes_split_pixels_and_statistics(data, settings):
    folder, shards = data
    kwargs = dict(val_fraction=0.25, test_fraction=0.25, batch_size=4, **settings)
    from_folder = ImageFolderDataModule(str(folder), **kwargs)
    from_shards = ImageFolderDataModule(str(shards), **kwargs)
    assert from_folder.shards is None and len(from_shards.shards) >= 3
    assert from_shards.class_names == from_folder.class_names == ["ant", "cat", "dog"]
    from_folder.setup("fit")
    from_shards.setup("fit")
    assert split_paths(from_shards, None) == split_paths(from_folder, folder)
    assert split_paths(from_shards, None)["test"] != []
    assert sorted(p for ps in split_paths(from_shards, None).values() for p in ps) == sorted(from_shards.sample_paths)
    assert from_shards.sample_paths[:2] == ["ant/00.png", "ant/01.png"] and len(from_shards.sample_paths) == 26
    assert torch.equal(from_shards.mean, from_folder.mean) and torch.equal(from_shards.std, from_folder.std)
    assert from_shards.split_sizes == from_folder.split_sizes and from_shards.class_counts == from_folder.class_counts
    a, b = first_batches(from_folder), first_batches(from_shards)
    for split in SPLITS:
        assert len(a[split]) == len(b[split]) >= 1
        for (xa, ya), (xb, yb) in zip(a[split], b[split]):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
    if settings.get("cache"):
        assert all(torch.equal(from_shards.datasets[s].images, from_folder.datasets[s].images) for s in SPLITS)
    assert from_shards.state_dict() == from_folder.state_dict()


def test_one_parquet_file_as_root_and_the_folders_detection(data, tmp_path):
    folder, _ = data
    single = pack(folder, tmp_path / "one")  # one shard
    file = ImageFolderDataModule(str(single / "part-00000.parquet"), image_size=8, val_fraction=0.25)
    from_folder = ImageFolderDataModule(str(folder), image_size=8, val_fraction=0.25)
    file.setup("fit")
    from_folder.setup("fit")
    assert file.class_names == from_folder.class_names
    assert split_paths(file, None) == split_paths(from_folder, folder)
    # rows in any order, in one file: the samples are ordered by (label, path) all the same
    table = pq.read_table(single / "part-00000.parquet")
    shuffled = table.take(np.random.default_rng(0).permutation(len(table)))
    assert shuffled["path"].to_pylist() != table["path"].to_pylist()
    pq.write_table(shuffled, tmp_path / "shuffled.pq")
    any_order = ImageFolderDataModule(str(tmp_path / "shuffled.pq"), image_size=8, val_fraction=0.25)
    any_order.setup("fit")
    assert split_paths(any_order, None) == split_paths(from_folder, folder)
    assert torch.equal(any_order.mean, from_folder.mean)
    # a folder with class sub-folders is an image folder even when it holds a Parquet file too
    (folder / "stray.parquet").write_bytes((single / "part-00000.parquet").read_bytes())
    try:
        assert ImageFolderDataModule(str(folder)).shards is None
    finally:
        (folder / "stray.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(f"root file '{tmp_path / 'gone.parquet'}' does not exist")):
        ImageFolderDataModule(str(tmp_path / "gone.parquet"))


def test_predictions_are_identified_by_the_stored_paths(data):
    folder, shards = data
    kwargs = dict(image_size=8, val_fraction=0.25, test_fraction=0.25)
    from_folder = ImageFolderDataModule(str(folder), **kwargs)
    from_shards = ImageFolderDataModule(str(shards), **kwargs)
    xa = torch.cat([x for x, _ in from_folder.predict_dataloader()])
    xb = torch.cat([x for x, _ in from_shards.predict_dataloader()])
    assert torch.equal(xa, xb)
    assert from_shards.prediction_ids == [os.path.relpath(p, folder) for p in from_folder.prediction_ids]
    assert all(not os.path.isabs(p) and "/" in p for p in from_shards.prediction_ids)
    # the raw examples (the MLflow model's input example) are images: the stored path is their id
    frame = from_shards.raw_examples()
    dataset, ids = from_shards.frame_data(frame)
    assert ids[:4] == from_shards.sample_paths[:4] and len(dataset) == 5
    stored = ImageFolderDataset([from_shards.shard_rows().images[0]], None, (8, 8), 3, from_shards.mean,
                                from_shards.std)
    assert torch.equal(dataset[0][0], stored[0][0])  # an 8x8 PNG's thumbnail holds its pixels


def test_checkpoint_state_and_class_names_check_as_for_a_folder(data, tmp_path):
    folder, shards = data
    trained = ImageFolderDataModule(str(folder), image_size=8, seed=0)
    trained.setup("fit")
    state = trained.state_dict()
    restored = ImageFolderDataModule(str(shards), image_size=8, seed=1)  # another split: the checkpoint's statistics
    restored.load_state_dict(state)
    restored.setup("fit")
    assert torch.equal(restored.mean, trained.mean) and restored.state_dict() == state
    with pytest.raises(ValueError, match=re.escape(f"trained on classes ['ant', 'bee', 'dog'] but {str(shards)!r} "
                                                   "holds the labels ['ant', 'cat', 'dog']")):
        ImageFolderDataModule(str(shards)).load_state_dict({**state, "class_names": ["ant", "bee", "dog"]})


def test_a_fit_from_the_folder_and_from_the_shards_is_the_same(data):
    folder, shards = data

    def fit(root: Path) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        lightning.seed_everything(0, verbose=False)
        dm = ImageFolderDataModule(str(root), image_size=8, batch_size=4, augment=True, crop_padding=1,
                                   val_fraction=0.25, test_fraction=0.25, seed=0)
        model = ClassificationModule(ConvNet(dm.in_channels, dm.num_classes, widths=[4, 8]), num_classes=3)
        trainer = lightning.Trainer(max_epochs=1, deterministic=True, logger=False, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                                    devices=1)
        trainer.fit(model, datamodule=dm)
        metrics = {**trainer.validate(model, datamodule=dm, verbose=False)[0],
                   **trainer.test(model, datamodule=dm, verbose=False)[0]}
        return {k: v.clone() for k, v in model.state_dict().items()}, metrics

    weights_a, metrics_a = fit(folder)
    weights_b, metrics_b = fit(shards)
    assert weights_a.keys() == weights_b.keys() and all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert metrics_a == metrics_b and {"val/loss", "val/acc", "test/acc"} <= metrics_a.keys()


def test_a_parquet_file_that_is_not_an_image_shard_is_one_line(tmp_path):
    bad = tmp_path / "table.parquet"
    pq.write_table(pa.table({"label": ["a", "b"], "x": [1, 2]}), bad)
    with pytest.raises(ValueError) as caught:
        ImageFolderDataModule(str(bad))
    assert str(caught.value) == (
        f"ImageFolderDataModule: {bad} is not an image shard: it lacks the column(s) image, path (an image shard, as "
        "`recipes pack` writes, has image (binary), label (string) and path (string); it has label, x)")
    pq.write_table(pa.table({"image": [b"x", b"y"], "label": [1, 2], "path": ["a/1.png", "b/2.png"]}), bad)
    with pytest.raises(ValueError, match=re.escape(f"ImageFolderDataModule: {bad} is not an image shard: label is "
                                                   "int64, not string")):
        ImageFolderDataModule(str(bad))
    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(pa.table({"image": ["not bytes"], "label": ["a"], "path": ["a/1.png"]}), folder / "x.parquet")
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'x.parquet'} is not an image shard: image is string, "
                                                   "not binary")):
        ImageFolderDataModule(str(folder))
    (folder / "x.parquet").write_bytes(b"not parquet")
    with pytest.raises(ValueError, match=re.escape(f"{folder / 'x.parquet'} is not a readable Parquet file")):
        ImageFolderDataModule(str(folder))


def test_a_bad_image_in_a_shard_is_named_by_its_path_and_shard(data, tmp_path):
    folder, shards = data
    table = pq.read_table(shards / "part-00000.parquet")
    images = table["image"].to_pylist()
    images[1] = b"this is not an image at all"
    bad = tmp_path / "bad" / "part-00000.parquet"
    bad.parent.mkdir()
    pq.write_table(table.set_column(0, "image", pa.array(images, pa.large_binary())), bad)
    for other in sorted(shards.glob("*.parquet"))[1:]:
        (bad.parent / other.name).write_bytes(other.read_bytes())
    dm = ImageFolderDataModule(str(bad.parent))
    name = table["path"].to_pylist()[1]
    with pytest.raises(ValueError, match=re.escape(f"ImageFolderDataModule: cannot read image {name} (in {bad}): "
                                                   f"UnidentifiedImageError: cannot identify image file '{name} (in "
                                                   f"{bad})'")):
        dm.setup("fit")
    # an image named twice, and shards of a single class
    (bad.parent / "part-00000.parquet").write_bytes((shards / "part-00000.parquet").read_bytes())
    (bad.parent / "part-99999.parquet").write_bytes((shards / "part-00000.parquet").read_bytes())
    first = table["path"].to_pylist()[0]
    with pytest.raises(ValueError, match=re.escape(f"the image {first!r} is in the shards twice "
                                                   f"({bad.parent / 'part-00000.parquet'} and "
                                                   f"{bad.parent / 'part-99999.parquet'})")):
        ImageFolderDataModule(str(bad.parent)).setup("fit")
    with pytest.raises(ValueError, match=re.escape(f"the image shards {str(bad)!r} hold 1 class ('ant'); "
                                                   "classification needs at least 2")):
        ImageFolderDataModule(str(bad))


def test_encoded_images_pickle_with_their_name_for_worker_processes(data):
    _, shards = data
    dm = ImageFolderDataModule(str(shards), image_size=8, val_fraction=0.25)
    dm.setup("fit")
    dataset = dm.datasets["train"]
    copy = pickle.loads(pickle.dumps(dataset))
    assert all(isinstance(p, EncodedImage) for p in copy.paths)
    assert [p.name for p in copy.paths] == [p.name for p in dataset.paths]
    assert all(torch.equal(copy[i][0], dataset[i][0]) for i in range(len(dataset)))
