"""BatchAugmentation on a CUDA batch (skipped without a GPU; the device run executes it): the global CPU and CUDA
generators are left where they were, the same seed and position give the same draws, a CUDA batch is augmented with
the same parameters as the same batch on the CPU (images equal to float rounding, soft targets equal), and no call
after the first makes a host-device synchronization."""

from __future__ import annotations

import pytest
import torch

from datamodules import BatchAugmentation

pytest.importorskip("kornia")
NO_CUDA = "needs a CUDA device"

MEAN, STD = torch.tensor([0.4, 0.5, 0.6]), torch.tensor([0.2, 0.25, 0.3])
FULL = dict(crop_scale=(0.3, 1.0), brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, mixup_alpha=0.4,
            cutmix_alpha=1.0)
CONFIGS = [{}, FULL, dict(crop_scale=None, flip=0.5, cutmix_alpha=1.0)]
IDS = ["crop-flip", "crop-flip-jitter-mix", "flip-cutmix"]


def batch(device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    unit = torch.rand(16, 3, 64, 64, generator=generator)
    images = (unit - MEAN.view(1, 3, 1, 1)) / STD.view(1, 3, 1, 1)
    return images.to(device), (torch.arange(16) % 3).to(device)


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
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_a_cuda_batch_gets_the_same_draws_as_on_the_cpu(config):
    state = {"seed": 9, "batches": 0}
    results = {}
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on: the crop coordinates must not depend on them
    try:
        for device in ("cpu", "cuda"):
            images, labels = batch(device)
            augmentation = BatchAugmentation(**config)
            augmentation.load_state_dict(state)
            results[device] = [augmentation(images, labels, MEAN, STD, 3) for _ in range(3)]
    finally:
        torch.set_float32_matmul_precision(precision)
    for (cpu_images, cpu_targets), (cuda_images, cuda_targets) in zip(results["cpu"], results["cuda"]):
        # the same crops, flips, factors and mixing: only float rounding of the warp and colour ops differs
        assert (cuda_images.cpu() - cpu_images).abs().max().item() < 1e-3
        assert torch.allclose(cuda_targets.cpu().float(), cpu_targets.float(), atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_a_cuda_call_makes_no_host_sync(config):
    images, labels = batch()
    augmentation = BatchAugmentation(**config)
    augmentation(images, labels, MEAN, STD, 3)  # the first call may allocate pinned memory and statistics
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        outputs = [augmentation(images, labels, MEAN, STD, 3) for _ in range(3)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    assert augmentation.state_dict()["batches"] == 4 and all(out.shape == images.shape for out, _ in outputs)
