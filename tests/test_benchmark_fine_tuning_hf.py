"""benchmarks/fine_tuning_hf.py in its quick mode: a tiny transformers ResNet pretrained on digits 0-4 through
``recipes fit``, saved as a transformers directory, fine-tuned on digits 5-9 beside the same network from scratch, each
scored with ``recipes predict`` (no accuracy difference is asserted: one seed of a short run; the README's table is
the full run)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


@pytest.mark.slow
def test_fine_tuning_hf_quick_pretrains_through_the_recipe_and_scores_every_variant(monkeypatch, workdir, capsys):
    pytest.importorskip("transformers")
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports _common from its own folder
    spec = importlib.util.spec_from_file_location("fine_tuning_hf", BENCHMARKS / "fine_tuning_hf.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fine_tuning_hf", module)
    spec.loader.exec_module(module)
    result = module.main(["--quick", "--no-write", "--workdir", str(workdir / "bench")])
    out = capsys.readouterr().out
    assert result["train_images"] == 50 and result["test_images"] == 449 and result["steps"] == 20
    assert result["source_images"] == 901 and result["source_accuracy"] >= 0.9  # 2 epochs on digits 0-4
    accuracies = result["accuracies"]
    assert list(accuracies) == ["scratch", "pretrained", "pretrained + frozen", "pretrained + unfreeze"]
    assert all(len(values) == 1 and 0.0 <= values[0] <= 1.0 for values in accuracies.values())
    # far above chance (0.2) once the backbone trains; the frozen one's new head sees 20 steps only
    assert min(accuracies["scratch"] + accuracies["pretrained"] + accuracies["pretrained + unfreeze"]) > 0.6, out
    assert accuracies["pretrained"] != accuracies["scratch"]  # other starting weights, same everything else
    for name in accuracies:
        assert f"| {name} | " in out
    # the pretrained network is a transformers directory whose labels are the pretraining classes
    exported = json.loads((workdir / "bench" / "pretrained_0_4" / "config.json").read_text())
    assert exported["id2label"] == {str(i): str(i) for i in range(5)}
    assert (workdir / "bench" / "pretrained_0_4" / "preprocessor_config.json").is_file()


def test_fine_tuning_network_hf_hands_its_arguments_to_the_hf_benchmark(monkeypatch, capsys):
    """``python benchmarks/fine_tuning.py --network hf ...`` is ``fine_tuning_hf.py ...`` (its options, its help)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("fine_tuning", BENCHMARKS / "fine_tuning.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fine_tuning", module)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as stop:
        module.main(["--network", "hf", "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "--pretrain-epochs" in out and "--no-processor" in out and "--unfreeze-at" in out
    with pytest.raises(SystemExit):
        module.main(["--help"])
    out = capsys.readouterr().out
    assert "--network {convnet,hf}" in out and "--steps" in out and "--no-processor" not in out


def test_fine_tuning_hf_refuses_a_workdir_that_holds_files(monkeypatch, capsys, tmp_path):
    """Runs of an earlier benchmark there would be ranked with the new ones (``--ckpt_path best``): one line, exit 2,
    the folder left as it was."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("fine_tuning_hf", BENCHMARKS / "fine_tuning_hf.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fine_tuning_hf", module)
    spec.loader.exec_module(module)
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit) as stop:
        module.main(["--quick", "--no-write", "--workdir", str(tmp_path)])
    assert stop.value.code == 2
    assert f"--workdir {tmp_path} is not empty" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
