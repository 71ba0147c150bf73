"""datamodules.BatchAugmentation: kornia crop, flip and jitter of whole train batches from a stream of its own
(the global generators untouched, the run's seed deciding the draws), mixup and cutmix soft targets, train batches
only, and one error line for a configuration that cannot work."""

from __future__ import annotations

import sys

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from datamodules import BatchAugmentation, ImageFolderDataModule
from tests.data_files import make_folder
from recipes.cli import main

pytest.importorskip("kornia")

MEAN, STD = torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3])


def batch(n: int = 8, size: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    unit = torch.rand(n, 3, size, size, generator=generator)
    return (unit - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1), torch.arange(n) % 3


FULL = dict(crop_scale=(0.3, 1.0), brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)


def test_the_draws_come_from_the_runs_seed_and_leave_the_global_generators_where_they_were():
    images, labels = batch()
    torch.manual_seed(7)
    augmentation = BatchAugmentation(**FULL)
    before = torch.get_rng_state()
    first, _ = augmentation(images, labels, MEAN, STD, 3)
    second, _ = augmentation(images, labels, MEAN, STD, 3)
    assert torch.equal(torch.get_rng_state(), before)  # dropout and the samplers see the same stream
    assert augmentation.state_dict() == {"seed": 7, "batches": 2}
    assert not torch.allclose(first, images) and not torch.allclose(first, second)  # a new draw every batch

    torch.manual_seed(7)
    again = BatchAugmentation(**FULL)
    assert torch.equal(again(images, labels, MEAN, STD, 3)[0], first)  # same seed_everything: same draws
    torch.manual_seed(8)
    other = BatchAugmentation(**FULL)
    assert not torch.allclose(other(images, labels, MEAN, STD, 3)[0], first)  # another seed: other draws

    resumed = BatchAugmentation(**FULL)  # a resumed run: the checkpoint's seed and count
    resumed.load_state_dict({"seed": 7, "batches": 1})
    assert torch.equal(resumed(images, labels, MEAN, STD, 3)[0], second)


def test_without_crop_flip_and_jitter_the_images_come_back_normalized_as_they_were():
    images, labels = batch()
    out, targets = BatchAugmentation(crop_scale=None, flip=0.0)(images, labels, MEAN, STD, 3)
    assert torch.allclose(out, images, atol=1e-5) and torch.equal(targets, labels)
    flipped, _ = BatchAugmentation(crop_scale=None, flip=1.0)(images, labels, MEAN, STD, 3)
    assert torch.allclose(flipped, images.flip(-1), atol=1e-5)


def test_crop_and_flip_on_normalized_images_equal_them_on_unit_values_normalized_after():
    images, labels = batch()
    unit = images * STD.view(1, 3, 1, 1) + MEAN.view(1, 3, 1, 1)
    torch.manual_seed(3)
    normalized, _ = BatchAugmentation(crop_scale=(0.3, 1.0))(images, labels, MEAN, STD, 3)
    torch.manual_seed(3)
    plain, _ = BatchAugmentation(crop_scale=(0.3, 1.0))(unit, labels, torch.zeros(3), torch.ones(3), 3)
    assert not torch.allclose(plain, unit, atol=1e-3)
    expected = (plain - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    assert torch.allclose(normalized, expected, atol=1e-4)


def test_mixup_mixes_images_and_one_hot_targets_with_one_weight():
    images, labels = batch()
    torch.manual_seed(0)
    out, targets = BatchAugmentation(crop_scale=None, flip=0.0, mixup_alpha=0.4)(images, labels, MEAN, STD, 3)
    assert targets.shape == (8, 3) and targets.dtype == torch.float32
    assert torch.allclose(targets.sum(dim=1), torch.ones(8))
    one_hot = torch.nn.functional.one_hot(labels, 3).float()
    lam = targets[0, labels[0]].item() if labels[0] != labels[-1] else None
    assert lam is not None and 0 < lam < 1
    assert torch.allclose(targets, lam * one_hot + (1 - lam) * one_hot.flip(0), atol=1e-6)
    assert torch.allclose(out, lam * images + (1 - lam) * images.flip(0), atol=1e-5)


def test_cutmix_weights_the_targets_by_the_pasted_area():
    n, size = 6, 16
    images = (torch.arange(n, dtype=torch.float32) / (n - 1)).view(n, 1, 1, 1).expand(n, 3, size, size).clone()
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    seen = 0
    for seed in range(6):
        torch.manual_seed(seed)
        out, targets = BatchAugmentation(crop_scale=None, flip=0.0, cutmix_alpha=1.0)(
            images, labels, torch.zeros(3), torch.ones(3), 3
        )
        pasted = (out[0, 0] == 1.0).float().mean().item()  # sample 0 gets its box from sample n-1
        assert targets[0, 0].item() == pytest.approx(1 - pasted, abs=1e-6)
        assert targets[0, 2].item() == pytest.approx(pasted, abs=1e-6)
        seen += 0 < pasted < 1
    assert seen >= 3


class Classifier(LightningModule):
    def __init__(self, task: str = "multiclass") -> None:
        super().__init__()
        self.num_classes, self.task = 3, task
        self.layer = torch.nn.Linear(3 * 8 * 8, 3)

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return torch.nn.functional.cross_entropy(self.layer(images.flatten(1)), targets)

    def validation_step(self, batch, batch_idx):
        return None

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Batches(Callback):
    def __init__(self) -> None:
        self.train: list = []
        self.val: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.train.append([t.clone() for t in batch])

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.val.append([t.clone() for t in batch])


def test_only_train_batches_are_augmented(tmp_path):
    make_folder(tmp_path / "images", {"a": 8, "b": 8, "c": 8}, size=(8, 8))
    data = ImageFolderDataModule(
        str(tmp_path / "images"), image_size=8, batch_size=6, val_fraction=0.25,
        batch_augmentation=BatchAugmentation(crop_scale=(0.5, 1.0), mixup_alpha=1.0),
    )
    record = Batches()
    trainer = Trainer(max_epochs=1, callbacks=[record], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1)
    trainer.fit(Classifier(), datamodule=data)
    plain_val = [list(b) for b in data.val_dataloader()]
    assert len(record.train) == 3 and all(seen[1].shape == (6, 3) for seen in record.train)  # mixed up
    assert len(record.val) == len(plain_val) + 1  # the sanity check's batch, then the epoch's
    for seen, plain in zip(record.val[1:], plain_val):
        assert torch.equal(seen[0], plain[0]) and torch.equal(seen[1], plain[1])
    assert data.state_dict()["batch_augmentation"]["batches"] == 3


RECIPE = """\
seed_everything: 0
trainer: {{max_epochs: 1, limit_train_batches: 2, limit_val_batches: 1}}
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    task: {task}
    model: {{class_path: lightning_modules.models.MLP, init_args: {{hidden_sizes: [8]}}}}
data:
  class_path: datamodules.ImageFolderDataModule
  init_args:
    root: images
    image_size: 8
    channels: {channels}
    batch_size: 4
    batch_augmentation: {{class_path: datamodules.BatchAugmentation, init_args: {augmentation}}}
"""


def refused(capsys, workdir, task="multiclass", channels=3, augmentation="{mixup_alpha: 0.2}") -> str:
    make_folder(workdir / "images", {"a": 6, "b": 6}, size=(8, 8))
    (workdir / "r.yaml").write_text(RECIPE.format(task=task, channels=channels, augmentation=augmentation))
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "r.yaml"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("recipes: error: ")
    return err


def test_mixup_with_a_binary_task_is_one_error_line(workdir, capsys):
    err = refused(capsys, workdir, task="binary")
    assert "mixup/cutmix make soft targets" in err and "task='binary'" in err and "mixup_alpha" in err


def test_hue_on_grayscale_images_is_one_error_line(workdir, capsys):
    err = refused(capsys, workdir, channels=1, augmentation="{hue: 0.1}")
    assert "saturation and hue need RGB images" in err


def test_kornia_missing_is_one_error_line_naming_the_extra(workdir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "kornia", None)
    monkeypatch.setitem(sys.modules, "kornia.augmentation", None)
    err = refused(capsys, workdir)
    assert 'pip install "loopwise[vision]"' in err


def test_a_data_module_rebuilt_from_saved_arguments_predicts_without_kornia(tmp_path, monkeypatch):
    """The MLflow model rebuilds the data module from its saved arguments, where batch_augmentation is the
    configuration (a dict), then loads the checkpoint's state: no augmentation, no kornia needed."""
    make_folder(tmp_path / "images", {"a": 4, "b": 4}, size=(8, 8))
    monkeypatch.setitem(sys.modules, "kornia", None)
    monkeypatch.setitem(sys.modules, "kornia.augmentation", None)
    saved = {"class_path": "datamodules.BatchAugmentation", "init_args": {"mixup_alpha": 0.2}}
    data = ImageFolderDataModule(str(tmp_path / "images"), image_size=8, batch_augmentation=saved)
    data.load_state_dict({"class_names": ["a", "b"], "mean": [0.5] * 3, "std": [0.25] * 3,
                          "batch_augmentation": {"seed": 0, "batches": 7}})
    assert data.batch_augmentation_state() == {}
    import pandas as pd

    dataset, ids = data.frame_data(pd.DataFrame({"path": [str(tmp_path / "images" / "a" / "00.png")]}))
    assert len(dataset) == 1 and ids == [str(tmp_path / "images" / "a" / "00.png")]
