"""Metric updates count with ``torch.bincount`` under ``deterministic: true``.

torchmetrics replaces ``torch.bincount`` by a comparison of every sample with every bin whenever torch's deterministic
algorithms are on (torchmetrics issue 3086): memory and time grow with samples x bins, and a multiclass confusion has
``num_classes**2`` bins. With 300 classes one update of 2,000 samples took 8.6 s and a 3.3 GB peak on a 2-core CPU,
against 1.4 ms. ``torch.bincount`` without weights is deterministic on the CPU and on CUDA, so the tasks' metric
updates run with the flag off and count natively: the same counts, and the flag as it was afterwards.
"""

from __future__ import annotations

import traceback

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.metrics.native_bincount import native_bincount
from lightning_modules.models import MLP


@pytest.fixture
def deterministic_flag_kept():
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def fit_many_classes(deterministic: bool, classes: int = 200) -> tuple[dict[str, float], object]:
    """A 200-class task trained and validated for one epoch on random data; the epoch's metrics and the val
    confusion matrix (400 samples, 40,000 bins)."""
    torch.manual_seed(0)
    x, y = torch.randn(400, 8), torch.randint(0, classes, (400,))
    loader = DataLoader(TensorDataset(x, y), batch_size=100)
    task = ClassificationModule(MLP(8, classes, [16]), num_classes=classes)
    trainer = L.Trainer(max_epochs=1, deterministic=deterministic, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.fit(task, loader, loader)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    return metrics, task.last_confusion_matrix["val"].clone()


def test_metric_updates_count_natively_under_deterministic_and_give_the_same_values(monkeypatch,
                                                                                      deterministic_flag_kept):
    native: list[str] = []
    bincount = torch.bincount

    def counted(x, *args, **kwargs):
        names = [frame.name for frame in traceback.extract_stack()]
        native.append("update" if "update_metrics" in names or "flush" in names else "compute")
        return bincount(x, *args, **kwargs)

    monkeypatch.setattr(torch, "bincount", counted)
    free_metrics, free_confusion = fit_many_classes(deterministic=False)
    free_calls = list(native)
    native.clear()
    metrics, confusion = fit_many_classes(deterministic=True)
    # the train F1, the val F1 and the confusion matrix count with torch.bincount as without the flag (the sanity
    # check's and the epoch's): 5 updates; AUROC's compute, which Lightning runs after the epoch, still takes
    # torchmetrics' comparison (samples x classes, not classes**2)
    assert free_calls.count("update") == 5 and native == ["update"] * 5
    assert free_calls.count("compute") == 2
    assert torch.are_deterministic_algorithms_enabled()  # Lightning's flag is on again after every update
    assert metrics.keys() == free_metrics.keys() and {"train/f1", "val/f1", "val/acc", "val/auroc"} <= metrics.keys()
    assert metrics == free_metrics  # the same counts, so the same values
    assert torch.equal(confusion, free_confusion) and int(confusion.sum()) == 400


@pytest.mark.parametrize("warn_only", [False, True])
def test_the_flag_is_off_inside_and_as_it_was_after_even_on_an_error(deterministic_flag_kept, warn_only):
    torch.use_deterministic_algorithms(True, warn_only=warn_only)
    with native_bincount():
        assert not torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only
    with pytest.raises(RuntimeError, match="boom"), native_bincount():
        raise RuntimeError("boom")
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled() == warn_only


def test_without_the_flag_nothing_changes(deterministic_flag_kept):
    torch.use_deterministic_algorithms(False)
    with native_bincount():
        assert not torch.are_deterministic_algorithms_enabled()
    assert not torch.are_deterministic_algorithms_enabled()
