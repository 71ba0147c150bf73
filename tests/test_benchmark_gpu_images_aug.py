"""benchmarks/gpu_images.py's bf16-aug setting (the ResNet with configs/image_finetune_hf.yaml's batch augmentation)
as a CPU smoke run: the recipe's data module really augments every training batch with those settings (no timing is
asserted), and the default settings leave it out."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.test_benchmark_gpu_images import REPO, load


def test_the_augmentation_is_the_image_recipes(monkeypatch):
    gpu_images = load(monkeypatch)
    recipe = yaml.safe_load((REPO / "configs" / "image_finetune_hf.yaml").read_text())
    assert gpu_images.AUGMENTATION == recipe["data"]["init_args"]["batch_augmentation"]
    assert "bf16-aug" not in gpu_images.DEFAULT_SETTINGS and "bf16-aug" in gpu_images.SETTINGS["resnet"]


def test_bf16_aug_cpu_smoke_augments_every_training_batch(monkeypatch, workdir, capsys):
    pytest.importorskip("transformers")
    pytest.importorskip("kornia")
    gpu_images = load(monkeypatch)
    import datamodules

    seen = []
    original = datamodules.BatchAugmentation.__call__

    def counting(self, images, *args, **kwargs):
        seen.append((tuple(images.shape), self.crop_scale, self.flip, self.jitter))
        return original(self, images, *args, **kwargs)

    monkeypatch.setattr(datamodules.BatchAugmentation, "__call__", counting)
    out_json = workdir / "gpu_images.json"
    assert gpu_images.main(["--device", "cpu", "--small", "--models", "resnet", "--settings", "bf16-aug",
                            "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "resnet bf16-aug" in out and "resnet: images/s (median of 1): bf16-aug " in out
    data = json.loads(out_json.read_text())
    assert list(data["runs"]["resnet"]) == ["bf16-aug"] and data["runs"]["resnet"]["bf16-aug"][0] > 0
    assert "errors" not in data
    # 56 training images of 64 (val 1/8), batch 16: 4 batches an epoch, 2 epochs, every one augmented
    assert len(seen) == 8
    assert {s[1:] for s in seen} == {((0.6, 1.0), 0.0, (0.2, 0.2, 0.2, 0.0))}  # brightness ... hue
    assert {s[0] for s in seen} == {(16, 3, 32, 32), (8, 3, 32, 32)}
