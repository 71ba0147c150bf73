"""Batched image augmentation on the training device: random resized crop, horizontal flip, colour jitter, and
optionally mixup and cutmix (soft targets), drawn from a stream of its own that checkpoints resume.

How: every random number of a batch is drawn on the CPU from a ``torch.Generator`` seeded for that batch
(``datamodules/augmentation_params.py``: torchvision's RandomResizedCrop rule, flips, jitter factors), the batch's
parameters travel to the device in one pinned asynchronous copy, crop + resize + flip is one bilinear warp
(``F.affine_grid`` + ``F.grid_sample``) and the colour jitter is ``kornia.enhance``'s functional ops with per-image
factors. Nothing is read back from the device: a step on a GPU never waits for it (``kornia.augmentation``'s modules
did: they sample on the CPU and copy with a synchronizing copy, and the resized crop solves its transforms with
``torch.linalg.solve``). Why kornia for the colour ops: maintained, batched on any device, no torchvision (which
does not load with the CPU torch wheel); albumentations works one numpy image at a time and NVIDIA DALI is a
GPU-only pipeline of its own. Mixup and cutmix are a few lines of tensor arithmetic (a batch mixed with its reverse,
as timm does; kornia's mixup draws its weight from a uniform range, not Beta(alpha, alpha)).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn import functional

from datamodules.augmentation_params import affine_matrices, crop_boxes, flips, jitter_factors, jitter_order

VISION_EXTRA = 'pip install "loopwise[vision]"'


def _kornia_enhance() -> Any:
    try:
        import kornia.enhance as enhance
    except ImportError:
        raise ValueError(f"BatchAugmentation needs kornia, which is not installed: {VISION_EXTRA}") from None
    return enhance


def _check_range(name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ValueError(f"BatchAugmentation: {name} must be in [{low}, {high}], got {value}")


def _slice_crops(images: Tensor, crops: list[list[int]]) -> Tensor:
    """Each image's box ``[x0, y0, w, h, flipped]`` sliced out, resized back bilinearly (``align_corners=True``:
    the samples of ``affine_matrices``' warp) and flipped; the CPU path, where the boxes are host numbers already."""
    out = torch.empty_like(images)
    size = (int(images.shape[-2]), int(images.shape[-1]))
    for i, (x0, y0, w, h, flipped) in enumerate(crops):
        crop = functional.interpolate(images[i:i + 1, :, y0:y0 + h, x0:x0 + w], size=size, mode="bilinear",
                                      align_corners=True)[0]
        out[i] = crop.flip(-1) if flipped else crop
    return out


def _warp(images: Tensor, theta: Tensor) -> Tensor:
    """``grid_sample`` (bilinear, ``align_corners=True``) at ``F.affine_grid(theta, ..., align_corners=True)``'s
    points, the grid built elementwise: a crop and flip have no shear (x' = a x + b, y' = c y + d), and
    ``affine_grid`` is a batched matmul, which TF32 (``float32_matmul_precision: high``) would round to ~1e-3."""
    batch, _, height, width = images.shape
    xs = torch.linspace(-1.0, 1.0, width, device=images.device, dtype=images.dtype)
    ys = torch.linspace(-1.0, 1.0, height, device=images.device, dtype=images.dtype)
    grid_x = (theta[:, 0, 0, None] * xs + theta[:, 0, 2, None])[:, None, :].expand(batch, height, width)
    grid_y = (theta[:, 1, 1, None] * ys + theta[:, 1, 2, None])[:, :, None].expand(batch, height, width)
    grid = torch.stack([grid_x, grid_y], dim=-1)
    return functional.grid_sample(images, grid, mode="bilinear", padding_mode="zeros", align_corners=True)


class BatchAugmentation:
    """Augment whole train batches after their transfer to the training device (the GPU when there is one).

    Applied by the data module's ``on_after_batch_transfer`` to training batches only (validation, test and
    predict batches are never augmented). Images arrive normalized with the data's mean and std: with colour jitter
    they are mapped back to [0, 1], cropped, flipped and jittered there (``kornia.enhance``) and normalized
    again (crop and flip alone commute with the normalization and skip the round trip), then mixed.
    With mixup or cutmix on, every train batch's labels become soft targets ``(batch, num_classes)`` (one-hot
    mixed with the partner's), which ``ClassificationModule(task='multiclass')`` learns from.

    Randomness: every batch draws, on the CPU, from a generator of its own seeded by the run's seed
    (``seed_everything``), the process rank and a count of augmented batches: the global generators that dropout and
    the samplers use are never touched, so switching augmentation on changes nothing else. The seed and the count are
    in the data module's checkpoint state, so a resumed run (mid-epoch too) augments its remaining batches exactly as
    the uninterrupted run did. The draws do not depend on the device: a GPU run crops, flips, jitters and mixes with
    the same parameters as a CPU run (the images agree to float rounding).

    Needs the optional extra ``loopwise[vision]`` (kornia).

    Args:
        crop_scale: Range of the crop's area as a fraction of the image (random resized crop, resized back to the
            image size); ``null`` disables the crop.
        crop_ratio: Range of the crop's aspect ratio (width / height).
        flip: Probability of a horizontal flip per image (0 disables it).
        brightness: Colour jitter: brightness factor drawn from [1 - b, 1 + b] (0 leaves brightness).
        contrast: Colour jitter: contrast factor drawn from [1 - c, 1 + c].
        saturation: Colour jitter: saturation factor drawn from [1 - s, 1 + s] (RGB images only).
        hue: Colour jitter: hue shift drawn from [-h, h], h <= 0.5 (RGB images only).
        jitter_p: Probability that an image is colour-jittered (when any jitter amount is > 0).
        mixup_alpha: Mixup: the weight of an image is drawn from Beta(alpha, alpha) once per batch and the image
            mixed with the batch's reversed order; 0 disables mixup.
        mixup_p: Probability that a batch is mixed up.
        cutmix_alpha: Cutmix: a box of area (1 - lambda), lambda ~ Beta(alpha, alpha), is pasted from the batch's
            reversed order; the targets are mixed by the pasted area. 0 disables cutmix. With both on, each batch
            chooses one of the two with equal chance.
        cutmix_p: Probability that a batch is cut-mixed.
    """

    def __init__(
        self,
        crop_scale: tuple[float, float] | None = (0.08, 1.0),
        crop_ratio: tuple[float, float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        brightness: float = 0.0,
        contrast: float = 0.0,
        saturation: float = 0.0,
        hue: float = 0.0,
        jitter_p: float = 0.8,
        mixup_alpha: float = 0.0,
        mixup_p: float = 1.0,
        cutmix_alpha: float = 0.0,
        cutmix_p: float = 1.0,
    ) -> None:
        if crop_scale is not None and not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
            raise ValueError(f"BatchAugmentation: crop_scale must be (low, high) with 0 < low <= high <= 1, got "
                             f"{tuple(crop_scale)}")
        if not 0.0 < crop_ratio[0] <= crop_ratio[1]:
            raise ValueError(f"BatchAugmentation: crop_ratio must be (low, high) with 0 < low <= high, got "
                             f"{tuple(crop_ratio)}")
        for name, value, high in (("flip", flip, 1.0), ("brightness", brightness, 1.0), ("contrast", contrast, 1.0),
                                  ("saturation", saturation, 1.0), ("hue", hue, 0.5), ("jitter_p", jitter_p, 1.0),
                                  ("mixup_p", mixup_p, 1.0), ("cutmix_p", cutmix_p, 1.0)):
            _check_range(name, value, 0.0, high)
        for name, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if value < 0:
                raise ValueError(f"BatchAugmentation: {name} must be >= 0 (0 disables it), got {value}")
        _kornia_enhance()  # installed? (imported again where the jitter runs: a module does not deep-copy)
        self.crop_scale = None if crop_scale is None else (float(crop_scale[0]), float(crop_scale[1]))
        self.crop_ratio = (float(crop_ratio[0]), float(crop_ratio[1]))
        self.flip = flip
        self.jitter = (brightness, contrast, saturation, hue)
        self.jitter_p = jitter_p
        self.mixup = (mixup_alpha, mixup_p)
        self.cutmix = (cutmix_alpha, cutmix_p)
        self._stats: tuple[Any, tuple[Tensor, Tensor]] | None = None  # mean/std on the batch's device
        self.seed: int | None = None  # the run's seed (seed_everything), fixed at the first batch or restored
        self.batches = 0  # train batches augmented so far in the run

    # --- what it makes --------------------------------------------------------------------------------------
    @property
    def soft_targets(self) -> bool:
        """Whether train batches get soft targets ``(batch, num_classes)`` (mixup or cutmix on)."""
        return self.mixup[0] > 0 or self.cutmix[0] > 0

    def check_model(self, model: Any, data_name: str) -> None:
        """Raise a ``ValueError`` when mixup/cutmix's soft targets meet a model that does not learn from them."""
        if not self.soft_targets:
            return
        classes = getattr(model, "num_classes", None)
        task = getattr(model, "task", None)
        if not isinstance(classes, int) or task != "multiclass":
            what = f"task={task!r}" if isinstance(classes, int) else f"{type(model).__name__} (no num_classes)"
            raise ValueError(
                f"{data_name}: batch_augmentation's mixup/cutmix make soft targets (batch, num_classes) that only "
                f"a multiclass classifier learns from, not {what}: set mixup_alpha and cutmix_alpha to 0, or use "
                "lightning_modules.ClassificationModule with task: multiclass"
            )

    def check_channels(self, channels: int, data_name: str) -> None:
        """Saturation and hue need RGB images."""
        if channels != 3 and (self.jitter[2] > 0 or self.jitter[3] > 0):
            raise ValueError(f"{data_name}: batch_augmentation's saturation and hue need RGB images (channels: 3), "
                             f"got channels={channels}; set them to 0")

    # --- checkpoint state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The run's augmentation seed and the count of augmented batches (plain ints)."""
        return {"seed": self.seed, "batches": self.batches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from a checkpoint's seed and count."""
        self.seed = None if state.get("seed") is None else int(state["seed"])
        self.batches = int(state.get("batches", 0))

    # --- augmentation ---------------------------------------------------------------------------------------
    def _draw(self, generator: torch.Generator, batch: int, height: int,
              width: int) -> tuple[Tensor, list[int], list[list[int]] | None]:
        """The batch's parameters on the CPU, packed ``(B, 10)``: the 2x3 crop+flip matrix, then the 4 jitter
        factors; the jitter steps' order; and the crops as ``[x0, y0, w, h, flipped]`` ints (when cropping)."""
        boxes = None if self.crop_scale is None else crop_boxes(generator, batch, height, width, self.crop_scale,
                                                                 self.crop_ratio)
        flipped = flips(generator, batch, self.flip) if self.flip > 0 else None
        theta = affine_matrices(boxes, flipped, batch, height, width).view(batch, 6)
        factors, order = torch.zeros(batch, 4), [0, 1, 2, 3]
        if self.jittered:
            factors = jitter_factors(generator, batch, self.jitter, self.jitter_p)
            order = jitter_order(generator)
        crops = None
        if boxes is not None:
            flags = torch.zeros(batch, 1, dtype=torch.float64) if flipped is None else flipped.view(-1, 1).double()
            crops = torch.cat([boxes, flags], dim=1).long().tolist()
        return torch.cat([theta, factors], dim=1), order, crops

    @property
    def jittered(self) -> bool:
        """Whether colour jitter is on (any amount > 0)."""
        return any(amount > 0 for amount in self.jitter)

    def _transform(self, images: Tensor, params: Tensor, order: list[int], crops: list[list[int]] | None) -> Tensor:
        """Crop+resize+flip as one bilinear warp of the batch (``align_corners=True``, as kornia's crop); on the CPU
        a slice and resize per image (the same samples, ~3x faster there at 224 px), or a flip alone; then the
        colour jitter of [0, 1] images with per-image factors (identity where not jittered)."""
        batch = images.shape[0]
        if crops is not None and images.device.type == "cpu":
            images = _slice_crops(images, crops)
        elif self.crop_scale is not None:
            images = _warp(images, params[:, :6].view(batch, 2, 3).to(images.dtype))
        elif self.flip > 0:  # a flip alone: exact, no resampling (the matrix's x scale is -1 for a flipped image)
            images = torch.where(params[:, 0].view(batch, 1, 1, 1) < 0, images.flip(-1), images)
        if not self.jittered:
            return images
        enhance = _kornia_enhance()
        steps = (enhance.adjust_brightness_accumulative, enhance.adjust_contrast_with_mean_subtraction,
                 enhance.adjust_saturation_with_gray_subtraction,
                 lambda x, turns: enhance.adjust_hue(x, turns * (2 * math.pi)).clamp(0.0, 1.0))
        factors = params[:, 6:].to(images.dtype)
        for step in order:
            if self.jitter[step] > 0:
                images = steps[step](images, factors[:, step])
        return images

    def __call__(self, images: Tensor, labels: Tensor, mean: Tensor, std: Tensor, num_classes: int,
                 rank: int = 0) -> tuple[Tensor, Tensor]:
        """One augmented train batch: ``images`` normalized ``(B, C, H, W)`` with ``mean``/``std`` per channel,
        ``labels`` class indices ``(B,)``; returns the images (normalized again) and the labels, soft
        ``(B, num_classes)`` float when mixup or cutmix is on."""
        if self.seed is None:
            self.seed = int(torch.initial_seed())  # seed_everything's seed (the CPU generator's initial seed)
        rng = np.random.default_rng([self.seed, rank, self.batches])
        self.batches += 1
        generator = torch.Generator().manual_seed(int(rng.integers(2**62)))
        batch, height, width = int(images.shape[0]), int(images.shape[-2]), int(images.shape[-1])
        if self.crop_scale is not None or self.flip > 0 or self.jittered:
            params, order, crops = self._draw(generator, batch, height, width)
            if images.device.type == "cuda":  # one pinned, asynchronous copy of all the batch's parameters
                params = params.pin_memory().to(images.device, non_blocking=True)
            elif images.device.type != "cpu":  # another accelerator: one plain copy
                params = params.to(images.device)
            if self.jittered:  # colour jitter works on [0, 1] values
                mean, std = self._statistics(mean, std, images)
                unit = (images * std + mean).clamp_(0.0, 1.0)
                images = (self._transform(unit, params, order, crops) - mean) / std
            else:  # a crop's bilinear resize and a flip commute with the per-channel normalization: no round trip
                images = self._transform(images, params, order, crops)
        if not self.soft_targets:
            return images, labels
        classes = torch.arange(num_classes, device=labels.device)
        targets = (labels.long().view(-1, 1) == classes).to(images.dtype)  # one-hot without one_hot's checks
        return self._mix(images, targets, rng)

    def _statistics(self, mean: Tensor, std: Tensor, images: Tensor) -> tuple[Tensor, Tensor]:
        """``mean`` and ``std`` as ``(1, C, 1, 1)`` tensors on the batch's device, copied there once."""
        key = (mean.tolist(), std.tolist(), images.device, images.dtype)
        if self._stats is None or self._stats[0] != key:
            shape = (1, -1, 1, 1)
            device, dtype = images.device, images.dtype
            self._stats = (key, (mean.to(device, dtype).view(shape), std.to(device, dtype).view(shape)))
        return self._stats[1]

    def _mix(self, images: Tensor, targets: Tensor, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
        """Mixup or cutmix of the batch with its reverse; every number is drawn on the host (no device sync)."""
        kinds = [kind for kind, (alpha, _) in (("mixup", self.mixup), ("cutmix", self.cutmix)) if alpha > 0]
        kind = kinds[int(rng.integers(len(kinds)))]
        alpha, p = self.mixup if kind == "mixup" else self.cutmix
        lam = float(rng.beta(alpha, alpha))
        if rng.random() >= p or len(images) < 2:
            return images, targets
        partner_images, partner_targets = images.flip(0), targets.flip(0)
        if kind == "mixup":
            return images * lam + partner_images * (1.0 - lam), targets * lam + partner_targets * (1.0 - lam)
        height, width = int(images.shape[-2]), int(images.shape[-1])
        cut = math.sqrt(1.0 - lam)
        cut_h, cut_w = int(height * cut), int(width * cut)
        cy, cx = int(rng.integers(height)), int(rng.integers(width))
        y0, y1 = max(cy - cut_h // 2, 0), min(cy + cut_h // 2, height)
        x0, x1 = max(cx - cut_w // 2, 0), min(cx + cut_w // 2, width)
        rows = torch.arange(height, device=images.device).view(-1, 1)  # the box as a mask: no copy, no slicing
        columns = torch.arange(width, device=images.device).view(1, -1)
        box = (rows >= y0) & (rows < y1) & (columns >= x0) & (columns < x1)
        mixed = torch.where(box, partner_images, images)
        kept = 1.0 - (y1 - y0) * (x1 - x0) / (height * width)  # the pasted area decides the targets' weights
        return mixed, targets * kept + partner_targets * (1.0 - kept)


class BatchAugmented:
    """The data-module side: ``on_after_batch_transfer`` augments train batches with ``self.batch_augmentation``
    (a ``BatchAugmentation`` or ``None``), using the module's ``mean``, ``std`` and ``num_classes``; ``setup``
    checks the model and the channels first. Mixed into a data module before ``BaseDataModule``.

    A data module rebuilt from its saved arguments to predict (the MLflow model) holds the augmentation's saved
    configuration instead (a dict): it is never used there, and needs no kornia."""

    batch_augmentation: BatchAugmentation | Any

    def _augmentation(self) -> BatchAugmentation | None:
        augmentation = self.batch_augmentation
        return augmentation if isinstance(augmentation, BatchAugmentation) else None

    def setup(self, stage: str | None = None) -> None:
        trainer = getattr(self, "trainer", None)
        if self.batch_augmentation is not None and stage == "fit" and trainer is not None:
            augmentation = self._augmentation()
            name = type(self).__name__
            if augmentation is None:
                raise ValueError(f"{name}: batch_augmentation must be a datamodules.BatchAugmentation (class_path: "
                                 f"datamodules.BatchAugmentation), got {type(self.batch_augmentation).__name__}")
            augmentation.check_model(trainer.lightning_module, name)
            augmentation.check_channels(int(getattr(self, "channels", 3)), name)
        super().setup(stage)  # type: ignore[misc]

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        augmentation = self._augmentation()
        trainer = getattr(self, "trainer", None)
        if augmentation is None or trainer is None or not trainer.training:
            return batch
        images, labels = batch
        mean, std = getattr(self, "mean"), getattr(self, "std")
        images, labels = augmentation(images, labels, mean, std, int(getattr(self, "num_classes")),
                                      rank=int(trainer.global_rank))
        return images, labels

    def batch_augmentation_state(self) -> dict[str, Any]:
        """The augmentation's checkpoint state under ``batch_augmentation`` (empty without one)."""
        augmentation = self._augmentation()
        return {} if augmentation is None else {"batch_augmentation": augmentation.state_dict()}

    def load_batch_augmentation_state(self, state: dict[str, Any]) -> None:
        """Restore the augmentation's position from a checkpoint's state (a checkpoint without one: kept)."""
        augmentation, saved = self._augmentation(), state.get("batch_augmentation")
        if augmentation is not None and saved is not None:
            augmentation.load_state_dict(saved)


__all__ = ["BatchAugmentation", "BatchAugmented", "VISION_EXTRA"]
