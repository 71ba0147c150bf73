"""Mid-epoch exact resume of ``configs/image_finetune_hf.yaml`` itself (a tiny local ResNet standing in for the hub
model): its batched crop and colour jitter, the backbone frozen in epoch 0 and unfrozen in epoch 1, layer-wise
learning rates and warmup + cosine. SIGTERM in the middle of epoch 1 (after the unfreezing), ``--ckpt_path last``,
and the resumed run trains the same augmented batches and ends bit-for-bit as the uninterrupted one."""

from __future__ import annotations

import pytest
import torch

from tests.checkpoints.test_exact_resume_augmented import AugmentedBatchRecorder, same_batches
from tests.conftest import CONFIGS, runs_of
from tests.exact_resume_runs import SigtermAtStep, assert_same_training_state, fit, last_of
from tests.hf_models import hf_image_overrides

pytest.importorskip("kornia")
pytest.importorskip("transformers")

RECIPE = CONFIGS / "image_finetune_hf.yaml"


@pytest.mark.slow
def test_the_image_recipe_resumes_mid_epoch_exactly_with_its_augmentation(workdir, monkeypatch):
    args = [*hf_image_overrides("resnet"), "--trainer.max_epochs", "2"]
    stop_at = 9  # 6 batches an epoch (the fit helper's limit): epoch 1, after its batch 3, the backbone unfrozen
    straight_log: list = []
    fit(monkeypatch, RECIPE, *args, extra_callbacks=[AugmentedBatchRecorder(straight_log)])
    stopped_log: list = []
    with pytest.raises(SystemExit) as exc:
        fit(monkeypatch, RECIPE, *args, extra_callbacks=[SigtermAtStep(stop_at), AugmentedBatchRecorder(stopped_log)])
    assert exc.value.code == 143
    resumed_log: list = []
    fit(monkeypatch, RECIPE, *args, "--ckpt_path", "last", extra_callbacks=[AugmentedBatchRecorder(resumed_log)])
    straight, stopped = runs_of(workdir, "image_finetune_hf")
    assert stopped.info.status == "FINISHED"

    assert len(straight_log) == 12
    assert same_batches(stopped_log, straight_log[:stop_at])
    assert same_batches(resumed_log, straight_log[stop_at:])  # the same crops and jitter after the resume
    a, b = last_of(workdir, "image_finetune_hf", straight.info.run_id), last_of(
        workdir, "image_finetune_hf", stopped.info.run_id
    )
    assert (a["epoch"], a["global_step"]) == (1, 12)
    assert a["ImageFolderDataModule"]["batch_augmentation"]["batches"] == 12
    assert_same_training_state(a, b)
    # the backbone trained in epoch 1 in both runs: its weights moved away from the pretrained ones alike
    key = next(k for k in a["state_dict"] if k.startswith("model.model.resnet.") and k.endswith("convolution.weight"))
    assert torch.equal(a["state_dict"][key], b["state_dict"][key])
