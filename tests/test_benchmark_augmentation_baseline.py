"""benchmarks/augmentation.py --baseline FILE: another version's BatchAugmentation timed against today's on the
call alone (here the file is today's own module: the mechanics, not the figures)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_baseline_file_is_timed_against_todays_batch_augmentation(capsys, monkeypatch):
    pytest.importorskip("kornia")
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    spec = importlib.util.spec_from_file_location("augmentation_benchmark", REPO / "benchmarks" / "augmentation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    baseline = module.load_baseline(REPO / "datamodules" / "batch_augmentation.py")
    assert baseline.__module__ == "baseline_batch_augmentation"
    import torch

    module.compare_calls(baseline, torch.device("cpu"), [64], repeats=1)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("call alone")]
    assert [line.split(": ")[0] for line in lines] == ["call alone, 3x64x64, batch 64, crop+flip",
                                                       "call alone, 3x64x64, batch 64, crop+flip+jitter"]
    assert all("baseline / current = " in line for line in lines)
