"""The random parameters of one augmented batch, drawn on the CPU from a ``torch.Generator`` of the batch's own:
random resized crop boxes (torchvision's rule, vectorized over the batch), horizontal flips and colour-jitter
factors, and each image's 2x3 affine matrix for crop + resize + flip (``F.affine_grid``'s convention).

Drawn on the host so that the training device never waits: the whole batch's parameters then travel to the device
in one copy (``BatchAugmentation``), and a CPU and a GPU run draw exactly the same numbers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CROP_TRIES = 10  # torchvision's RandomResizedCrop: up to 10 tries, then the center crop


def crop_boxes(generator: torch.Generator, batch: int, height: int, width: int, scale: tuple[float, float],
               ratio: tuple[float, float]) -> Tensor:
    """``(batch, 4)`` integer boxes ``(x0, y0, w, h)`` by torchvision's ``RandomResizedCrop`` rule: up to 10 tries
    of area ~ U(scale) x image area and log(ratio) ~ U(log ratio) (width / height), the first that fits the image
    at a uniform position; an image none fits gets the center crop of its ratio clamped into ``ratio``."""
    area = float(height * width)
    fractions = torch.empty(batch, CROP_TRIES, dtype=torch.float64).uniform_(scale[0], scale[1], generator=generator)
    log_ratios = torch.empty(batch, CROP_TRIES, dtype=torch.float64).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator)
    positions = torch.rand(batch, 2, dtype=torch.float64, generator=generator)
    aspect = torch.exp(log_ratios)
    widths = torch.round(torch.sqrt(area * fractions * aspect))
    heights = torch.round(torch.sqrt(area * fractions / aspect))
    fits = (widths > 0) & (widths <= width) & (heights > 0) & (heights <= height)
    first = fits.to(torch.int64).argmax(dim=1, keepdim=True)  # the first try that fits (0 when none does)
    found = fits.any(dim=1)
    w = widths.gather(1, first).squeeze(1)
    h = heights.gather(1, first).squeeze(1)
    in_ratio = width / height  # the fallback: the center crop of the image's ratio clamped into the range
    if in_ratio < ratio[0]:
        fallback_w, fallback_h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        fallback_w, fallback_h = int(round(height * ratio[1])), height
    else:
        fallback_w, fallback_h = width, height
    w = torch.where(found, w, torch.full_like(w, fallback_w))
    h = torch.where(found, h, torch.full_like(h, fallback_h))
    x0 = torch.where(found, torch.floor(positions[:, 0] * (width - w + 1)), torch.floor((width - w) / 2))
    y0 = torch.where(found, torch.floor(positions[:, 1] * (height - h + 1)), torch.floor((height - h) / 2))
    return torch.stack([x0, y0, w, h], dim=1)


def flips(generator: torch.Generator, batch: int, p: float) -> Tensor:
    """``(batch,)`` booleans: which images are flipped horizontally (probability ``p`` each)."""
    return torch.rand(batch, generator=generator) < p


def affine_matrices(boxes: Tensor | None, flipped: Tensor | None, batch: int, height: int, width: int) -> Tensor:
    """``(batch, 2, 3)`` float32 matrices for ``F.affine_grid(..., align_corners=True)`` that resize each box to the
    whole image (its corner pixels onto the image's corner pixels, as kornia's crop maps them) and then flip it.

    Output pixel ``j`` of ``W`` reads the source at ``x0 + j (w - 1) / (W - 1)``; in normalized coordinates
    ``s = a t + b`` with ``a = (w - 1) / (W - 1)`` and ``b = (2 x0 + w - 1) / (W - 1) - 1`` (the same for y); a flip
    negates ``a``."""
    theta = torch.zeros(batch, 2, 3, dtype=torch.float64)
    if boxes is None:
        boxes = torch.tensor([[0.0, 0.0, width, height]], dtype=torch.float64).expand(batch, 4)
    x0, y0, w, h = boxes.unbind(1)
    span_x, span_y = max(width - 1, 1), max(height - 1, 1)
    a_x = (w - 1) / span_x
    if flipped is not None:
        a_x = torch.where(flipped, -a_x, a_x)
    theta[:, 0, 0] = a_x
    theta[:, 0, 2] = (2 * x0 + w - 1) / span_x - 1
    theta[:, 1, 1] = (h - 1) / span_y
    theta[:, 1, 2] = (2 * y0 + h - 1) / span_y - 1
    return theta.to(torch.float32)


def jitter_factors(generator: torch.Generator, batch: int, amounts: tuple[float, float, float, float],
                   p: float) -> Tensor:
    """``(batch, 4)`` float32 factors (brightness, contrast, saturation: multipliers from ``[max(0, 1 - a), 1 + a]``;
    hue: a shift in turns from ``[-a, a]``); an image not jittered (probability ``1 - p``) gets identity factors."""
    uniform = torch.rand(batch, 4, dtype=torch.float64, generator=generator)
    jittered = torch.rand(batch, generator=generator) < p
    low = torch.tensor([max(0.0, 1.0 - a) for a in amounts[:3]] + [-amounts[3]], dtype=torch.float64)
    high = torch.tensor([1.0 + a for a in amounts[:3]] + [amounts[3]], dtype=torch.float64)
    identity = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    factors = torch.where(jittered[:, None], low + uniform * (high - low), identity)
    return factors.to(torch.float32)


def jitter_order(generator: torch.Generator) -> list[int]:
    """The order of the four jitter steps for this batch (a random permutation, as kornia's ColorJitter draws)."""
    return torch.randperm(4, generator=generator).tolist()


__all__ = ["affine_matrices", "crop_boxes", "flips", "jitter_factors", "jitter_order"]
