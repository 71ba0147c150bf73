"""Mid-epoch exact resume with batched augmentation on: the image-folder recipe of test_exact_resume.py with
``batch_augmentation`` (random resized crop, flip, colour jitter and mixup), stopped by SIGTERM in the middle of
epoch 1 and resumed with ``--ckpt_path last``, trains the same augmented batches and ends bit-for-bit where the
uninterrupted run ends (the augmentation's seed and batch count travel in the data module's checkpoint state)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from tests.checkpoints.test_exact_resume import IMAGE_FOLDER_RECIPE
from tests.conftest import runs_of
from tests.exact_resume_runs import SigtermAtStep, assert_same_training_state, fit, last_of

pytest.importorskip("kornia")

AUGMENTATION = """num_workers: 2, seed: 0,
    batch_augmentation: {class_path: datamodules.BatchAugmentation, init_args: {crop_scale: [0.5, 1.0],
      brightness: 0.3, contrast: 0.3, saturation: 0.3, hue: 0.05, mixup_alpha: 0.4}}}"""


class AugmentedBatchRecorder(Callback):
    """(epoch, batch index, images, soft targets) of every training batch as the training step receives it."""

    def __init__(self, records: list) -> None:
        self.records = records

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        images, targets = batch
        self.records.append((trainer.current_epoch, batch_idx, images.clone(), targets.clone()))


def same_batches(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x[:2] == y[:2] and torch.equal(x[2], y[2]) and torch.equal(x[3], y[3]) for x, y in zip(a, b)
    )


@pytest.mark.slow
def test_resume_after_a_mid_epoch_sigterm_with_augmentation_equals_the_uninterrupted_run(workdir, monkeypatch):
    from tests.data_files import make_folder

    make_folder(workdir / "images", {"a": 40, "b": 40, "c": 40}, size=(8, 8))
    config = workdir / "image_folder_convnet.yaml"
    config.write_text(IMAGE_FOLDER_RECIPE.replace("num_workers: 2, seed: 0}", AUGMENTATION))
    recipe, stop_at = "image_folder_convnet", 9  # epoch 1, after its batch 3 of 6

    straight_log: list = []
    fit(monkeypatch, config, extra_callbacks=[AugmentedBatchRecorder(straight_log)])
    stopped_log: list = []
    with pytest.raises(SystemExit) as exc:
        fit(monkeypatch, config, extra_callbacks=[SigtermAtStep(stop_at), AugmentedBatchRecorder(stopped_log)])
    assert exc.value.code == 143
    resumed_log: list = []
    fit(monkeypatch, config, "--ckpt_path", "last", extra_callbacks=[AugmentedBatchRecorder(resumed_log)])
    straight, stopped = runs_of(workdir, recipe)
    assert stopped.info.status == "FINISHED"

    # the batches were augmented and mixed: soft targets (8, 3) that are not one-hot, summing to 1
    targets = torch.cat([record[3] for record in straight_log])
    assert targets.shape == (12 * 8, 3) and torch.allclose(targets.sum(dim=1), torch.ones(96))
    assert bool(((targets > 0) & (targets < 1)).any())
    assert same_batches(stopped_log, straight_log[:stop_at])
    assert same_batches(resumed_log, straight_log[stop_at:])  # the same crops, flips, jitter and mixing weights

    a, b = last_of(workdir, recipe, straight.info.run_id), last_of(workdir, recipe, stopped.info.run_id)
    assert (a["epoch"], a["global_step"]) == (1, 12)
    assert a["ImageFolderDataModule"]["batch_augmentation"] == {"seed": 0, "batches": 12}
    assert b["ImageFolderDataModule"]["batch_augmentation"] == {"seed": 0, "batches": 12}
    assert_same_training_state(a, b)
    sa, sb = a["callbacks"]["RandomStates"], b["callbacks"]["RandomStates"]
    assert torch.equal(sa["torch"], sb["torch"]) and torch.equal(sa["numpy"]["keys"], sb["numpy"]["keys"])
