"""benchmarks/gpu.py's bare-Lightning loop, its --loops choice and its --profile mode, as CPU smoke runs (tiny
ConvNet; no timing is asserted: the numbers only have to be there and be positive)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture
def gpu(monkeypatch, workdir):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports _common from its own folder
    spec = importlib.util.spec_from_file_location("gpu", BENCHMARKS / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu", module)  # the recipe finds HookProfiler / ProfileWindow as gpu.*
    spec.loader.exec_module(module)
    return module


def test_lightning_loop_beside_the_recipe_prints_both_ratios(gpu, capsys, tmp_path):
    out_json = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--steps", "small", "--loops", "lightning", "recipe",
                     "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "loops lightning, recipe" in out and " raw:" not in out  # --loops: the raw loop is not run
    assert "recipe / lightning = " in out and "lightning / raw" not in out and "recipe / raw" not in out
    data = json.loads(out_json.read_text())
    assert data["rows"] == []  # the recipe / raw target needs the raw loop
    (split,) = data["lightning_split"]
    assert split["setting"] == "fp32" and split["recipe/lightning"] > 0
    assert set(split["ms_per_step"]) == {"lightning", "recipe"} and min(split["ms_per_step"].values()) > 0
    assert data["images_per_s"]["fp32"]["lightning"] > 0 and len(data["runs"]["fp32"]["recipe"]) == 1


def test_lightning_module_has_the_raw_loops_batches_and_schedule(gpu):
    import torch

    size = gpu.sizes(True)
    x, y = gpu.train_data(size, torch.device("cpu"))
    batches = gpu.DeviceBatches(x, y, size["batch"])
    first = next(iter(batches))
    assert len(batches) == 10 and len(x) == 610 and first[0].shape == (64, 3, 32, 32)
    order = torch.randperm(610, generator=torch.Generator().manual_seed(0))[:64]  # the raw loop's first batch
    assert torch.equal(first[1], y[order])
    module = gpu.BareModule("fp32", size, channels_last=False, total_steps=20)
    config = module.configure_optimizers()
    assert type(config["optimizer"]).__name__ == "AdamW" and config["lr_scheduler"]["interval"] == "step"


def test_profile_writes_host_time_per_hook_and_the_self_cpu_table(gpu, capsys, tmp_path):
    out_txt, out_json = tmp_path / "profile.txt", tmp_path / "profile.json"
    assert gpu.main(["--device", "cpu", "--steps", "small", "--profile", "bf16", "--profile-out", str(out_txt),
                     "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "--profile bf16 needs CUDA; profiling fp32 on CPU instead" in out
    text = out_txt.read_text()
    for loop in ("lightning", "recipe"):
        assert f"{loop} fp32: 6 steps, host " in text  # 10 batches an epoch: batches 3..8 of the second
        assert f"top 15 by self CPU time ({loop}, fp32)" in text
    assert "run_training_batch" in text and "Self CPU time total" in text
    assert "[LightningModule]BareModule.optimizer_step" in text
    assert "[LightningModule]ClassificationModule.optimizer_step" in text  # the recipe's own module
    data = json.loads(out_json.read_text())
    for loop in ("lightning", "recipe"):
        hooks = {h["hook"]: h for h in data[loop]["hooks_ms_per_step"]}
        assert hooks["run_training_batch"]["calls"] == 1.0 and hooks["run_training_batch"]["ms"] > 0
        assert data[loop]["steps"] == 6 and data[loop]["host_ms_per_step"] >= hooks["run_training_batch"]["ms"]


@pytest.mark.parametrize("network", ["resnet18", "vit_s"])
def test_the_transformers_networks_run_in_every_loop_with_the_recipes_model(gpu, capsys, tmp_path, network):
    """Issue 58, point 4: the hand-written loop, bare Lightning and the recipe train the same Hugging Face network
    (built here with random weights, loaded by ``HFImageClassifier`` from its saved folder) on the same data."""
    out_json = tmp_path / "gpu.json"
    assert gpu.main(["--device", "cpu", "--steps", "small", "--network", network, "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert f"{network} (transformers, random weights: " in out and "3x32x32" in out
    assert "recipe / raw = " in out and "recipe / lightning = " in out
    data = json.loads(out_json.read_text())
    assert data["network"] == network and min(data["images_per_s"]["fp32"].values()) > 0
    size = gpu.sizes(True, network)
    gpu.save_hf_network(size, tmp_path / "net")
    from lightning_modules.models import HFImageClassifier

    assert isinstance(gpu.build_network(size), HFImageClassifier)
    assert f"name_or_path: \"{tmp_path / 'net'}\"" in gpu.network_config(size)
