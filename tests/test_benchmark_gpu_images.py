"""benchmarks/gpu_images.py: its CPU smoke run fine-tunes both networks through the recipe (no timing is asserted),
and without CUDA the full run says it is skipped."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def load(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports _common from its own folder
    spec = importlib.util.spec_from_file_location("gpu_images", BENCHMARKS / "gpu_images.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_images", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_images_cpu_smoke_fine_tunes_resnet_and_vit_through_the_recipe(monkeypatch, workdir, capsys):
    pytest.importorskip("transformers")
    gpu_images = load(monkeypatch)
    out_json = workdir / "gpu_images.json"
    assert gpu_images.main(["--device", "cpu", "--small", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "resnet: images/s (median of 1): fp32 " in out and "vit: images/s (median of 1): fp32 " in out
    assert "CPU smoke run: fp32 only, no ratios" in out
    data = json.loads(out_json.read_text())
    assert data["size"] == {"side": 32, "per_class": 16, "batch": 16, "epochs": 2, "workers": 0}
    assert data["runs"] == {"resnet": {"fp32": [data["images_per_s"]["resnet"]["fp32"]], "bf16": [], "bf16-nocl": []},
                            "vit": {"fp32": [data["images_per_s"]["vit"]["fp32"]], "bf16": []}}
    assert data["images_per_s"]["resnet"]["fp32"] > 0 and data["images_per_s"]["vit"]["fp32"] > 0
    assert data["loader_images_per_s"] > 0 and data["ratios"] == [] and "errors" not in data
    assert data["image_processor_refused"] == {}  # each network's own processor prepared the images


def test_gpu_images_without_cuda_says_it_is_skipped(monkeypatch, workdir, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out_json = workdir / "gpu_images.json"
    assert load(monkeypatch).main(["--json", str(out_json)]) == 0
    assert "gpu_images: skipped: torch sees no CUDA device" in capsys.readouterr().out
    assert json.loads(out_json.read_text()) == {"benchmark": "gpu_images", "skipped": "no CUDA device"}
