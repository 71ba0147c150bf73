"""BatchAugmentation on a CUDA batch (skipped without a GPU; the device run executes it): kornia samples on the
GPU, the global CPU and CUDA generators are left where they were, the same seed and position give the same draws,
and a call after the first makes no host-device synchronization."""

from __future__ import annotations

import pytest
import torch

from datamodules import BatchAugmentation

pytest.importorskip("kornia")
NO_CUDA = "needs a CUDA device"

MEAN, STD = torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3])
FULL = dict(crop_scale=(0.3, 1.0), brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, mixup_alpha=0.4,
            cutmix_alpha=1.0)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    images = torch.randn(16, 3, 64, 64, generator=generator)
    return images.cuda(), (torch.arange(16) % 3).cuda()


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_cuda_draws_are_seeded_and_leave_the_global_generators_alone():
    images, labels = batch()
    torch.manual_seed(5)
    augmentation = BatchAugmentation(**FULL)
    cpu_before, cuda_before = torch.get_rng_state(), torch.cuda.get_rng_state()
    first, soft = augmentation(images, labels, MEAN, STD, 3)
    second, _ = augmentation(images, labels, MEAN, STD, 3)
    assert torch.equal(torch.get_rng_state(), cpu_before) and torch.equal(torch.cuda.get_rng_state(), cuda_before)
    assert first.device.type == "cuda" and soft.shape == (16, 3) and not torch.allclose(first, second)
    torch.manual_seed(5)
    assert torch.equal(BatchAugmentation(**FULL)(images, labels, MEAN, STD, 3)[0], first)
    resumed = BatchAugmentation(**FULL)
    resumed.load_state_dict({"seed": 5, "batches": 1})
    assert torch.equal(resumed(images, labels, MEAN, STD, 3)[0], second)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
@pytest.mark.parametrize("jitter", [False, True], ids=["crop-flip", "crop-flip-jitter-mix"])
def test_a_cuda_call_makes_no_host_sync(jitter):
    images, labels = batch()
    augmentation = BatchAugmentation(**(FULL if jitter else {}))
    augmentation(images, labels, MEAN, STD, 3)  # builds the pipeline on the device
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        augmentation(images, labels, MEAN, STD, 3)
    finally:
        torch.cuda.set_sync_debug_mode("default")
