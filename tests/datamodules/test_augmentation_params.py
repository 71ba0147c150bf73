"""datamodules.augmentation_params: the crop boxes follow torchvision's RandomResizedCrop rule (area and ratio in
their ranges, inside the image, the center-crop fallback), the warp of a box equals slicing it out and resizing it
(F.interpolate, bilinear, align_corners=True), a flip flips, and the jitter factors stay in their ranges (identity
for an image not jittered). BatchAugmentation's output is checked against that reference for the box its
documented per-batch stream draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.nn import functional

from datamodules.augmentation_params import affine_matrices, crop_boxes, flips, jitter_factors

pytest.importorskip("kornia")


def test_crop_boxes_follow_the_scale_and_ratio_ranges_inside_the_image():
    height, width, scale, ratio = 48, 64, (0.2, 0.7), (3 / 4, 4 / 3)
    boxes = crop_boxes(torch.Generator().manual_seed(0), 4000, height, width, scale, ratio)
    x0, y0, w, h = boxes.unbind(1)
    assert torch.equal(boxes, boxes.round())  # whole pixels
    assert bool((x0 >= 0).all() and (y0 >= 0).all() and (x0 + w <= width).all() and (y0 + h <= height).all())
    # w and h are rounded to whole pixels: the area and the ratio may leave their ranges by that rounding only
    area = w * h / (height * width)
    slack = (w + h + 1) / (height * width)
    assert bool((area >= scale[0] - slack).all() and (area <= scale[1] + slack).all())
    aspect = w / h
    assert bool((aspect >= ratio[0] * (1 - 1 / h) - 1 / h).all() and (aspect <= ratio[1] * (1 + 1 / h) + 1 / h).all())
    # spread over the ranges: the mean area fraction of U(0.2, 0.7) is 0.45
    assert float(area.mean()) == pytest.approx(0.45, abs=0.02)
    assert float(aspect.min()) < 0.8 and float(aspect.max()) > 1.25
    # positions cover the image: some boxes touch the left and right borders
    assert bool((x0 == 0).any() and (x0 + w == width).any())


def test_a_box_that_never_fits_falls_back_to_the_center_crop_of_the_clamped_ratio():
    # the whole area at a ratio of at least 2 never fits a square image: the center crop of ratio 2
    boxes = crop_boxes(torch.Generator().manual_seed(0), 5, 32, 32, (1.0, 1.0), (2.0, 3.0))
    assert boxes.tolist() == [[0.0, 8.0, 32.0, 16.0]] * 5


def reference(image: torch.Tensor, box: list[float], flip: bool) -> torch.Tensor:
    x0, y0, w, h = (int(v) for v in box)
    crop = image[..., y0:y0 + h, x0:x0 + w]
    out = functional.interpolate(crop, size=image.shape[-2:], mode="bilinear", align_corners=True)
    return out.flip(-1) if flip else out


@pytest.mark.parametrize("flip", [False, True])
def test_the_warp_of_a_box_equals_slicing_it_and_resizing(flip):
    image = torch.rand(1, 3, 40, 56, generator=torch.Generator().manual_seed(2))
    box = [9.0, 5.0, 31.0, 22.0]
    theta = affine_matrices(torch.tensor([box], dtype=torch.float64), torch.tensor([flip]), 1, 40, 56)
    grid = functional.affine_grid(theta, [1, 3, 40, 56], align_corners=True)
    warped = functional.grid_sample(image, grid, mode="bilinear", align_corners=True)
    # both sample bilinearly at the same source points; they differ by float32 rounding of the grid coordinates
    # (~1e-7 relative on coordinates up to 55 px: ~1e-5 px) times a pixel-to-pixel difference of at most 1
    assert (warped - reference(image, box, flip)).abs().max().item() < 1e-4


def test_batch_augmentation_crops_the_box_its_stream_draws_and_the_flip_flips():
    from datamodules import BatchAugmentation

    unit = torch.rand(1, 3, 32, 48, generator=torch.Generator().manual_seed(3))
    augmentation = BatchAugmentation(crop_scale=(0.2, 0.6), flip=1.0)
    augmentation.load_state_dict({"seed": 11, "batches": 4})
    out, _ = augmentation(unit, torch.tensor([0]), torch.zeros(3), torch.ones(3), 2)
    # the documented stream: seed (run seed, rank, batch count) -> the batch's torch.Generator -> crop, then flip
    rng = np.random.default_rng([11, 0, 4])
    generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
    box = crop_boxes(generator, 1, 32, 48, (0.2, 0.6), (3 / 4, 4 / 3))[0].tolist()
    assert bool(flips(generator, 1, 1.0).all())
    assert box[2] * box[3] < 0.65 * 32 * 48  # a real crop, not the whole image
    assert (out - reference(unit, box, True)).abs().max().item() < 1e-4


def test_flips_follow_their_probability():
    generator = torch.Generator().manual_seed(0)
    assert bool(flips(generator, 50, 1.0).all()) and not bool(flips(generator, 50, 0.0).any())
    assert float(flips(generator, 4000, 0.3).float().mean()) == pytest.approx(0.3, abs=0.03)


def test_jitter_factors_stay_in_their_ranges_and_are_identity_where_an_image_is_not_jittered():
    factors = jitter_factors(torch.Generator().manual_seed(0), 4000, (0.4, 1.0, 0.2, 0.1), p=0.6)
    identity = torch.tensor([1.0, 1.0, 1.0, 0.0])
    kept = (factors == identity).all(dim=1)
    assert float(kept.float().mean()) == pytest.approx(0.4, abs=0.03)
    drawn = factors[~kept]
    low, high = torch.tensor([0.6, 0.0, 0.8, -0.1]), torch.tensor([1.4, 2.0, 1.2, 0.1])
    assert bool((drawn >= low - 1e-6).all() and (drawn <= high + 1e-6).all())
    assert torch.allclose(drawn.mean(dim=0), (low + high) / 2, atol=0.03)
    assert math.isclose(float(drawn[:, 3].abs().max()), 0.1, abs_tol=0.005)


def test_the_gpu_paths_batched_warp_equals_the_cpu_paths_slices():
    """The warp branch runs on a GPU only; here on the CPU it gets the same draws and must give the slices' images
    (to float rounding of the grid: the reference test's bound)."""
    from datamodules import BatchAugmentation

    unit = torch.rand(12, 3, 40, 40, generator=torch.Generator().manual_seed(4))
    augmentation = BatchAugmentation(crop_scale=(0.1, 0.9), brightness=0.3, hue=0.1)
    params, order, crops = augmentation._draw(torch.Generator().manual_seed(5), 12, 40, 40)
    sliced = augmentation._transform(unit, params, order, crops)
    warped = augmentation._transform(unit, params, order, None)  # no host boxes: the one batched warp
    assert not torch.allclose(sliced, unit, atol=1e-2)
    assert (warped - sliced).abs().max().item() < 1e-4
