"""One split of an image folder as a ``Dataset``: decoded (or cached) images, per-sample augmentation, normalization."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from datamodules.image_files import read_image


class ImageFolderDataset(Dataset):
    """One split of an image folder: ``(image, label)`` with the image a normalized float32 ``(C, H, W)`` tensor.

    Images come from ``images`` (decoded uint8 tensors held in memory) or are read from ``paths`` on every access.
    With ``augment`` each read takes a random crop of the image padded by ``crop_padding`` black pixels and flips
    it horizontally with probability 0.5, drawing from torch's global RNG (in a DataLoader worker: seeded from
    the loader's generator). Picklable, so it works with any number of workers and any start method.
    Without labels (new images to predict) a sample is ``(image,)``.

    Args:
        paths: The image files of the split (or the images' file bytes).
        labels: Class index per file (int64), or ``None`` for images without labels.
        size: Target ``(height, width)``.
        channels: 1 (grayscale) or 3 (RGB).
        mean: Per-channel mean of the pixel values scaled to [0, 1].
        std: Per-channel standard deviation of the pixel values scaled to [0, 1] (all > 0).
        augment: Random crop and horizontal flip on every read.
        crop_padding: Pixels of zero padding on each side before the random crop (0: flip only).
        images: Optional decoded uint8 ``(N, C, H, W)`` images in the order of ``paths``.
        prepare: An image processor's preprocessing (``ImagePreprocessing``) that decodes instead of the conversion
            and bilinear resize.
    """

    def __init__(
        self,
        paths: Sequence[str | bytes],
        labels: Tensor | None,
        size: tuple[int, int],
        channels: int,
        mean: Tensor,
        std: Tensor,
        augment: bool = False,
        crop_padding: int = 4,
        images: Tensor | None = None,
        prepare: Callable[[Image.Image], np.ndarray] | None = None,
    ) -> None:
        if (labels is not None and len(paths) != len(labels)) or (images is not None and len(images) != len(paths)):
            raise ValueError(
                f"ImageFolderDataset: {len(paths)} paths, {None if labels is None else len(labels)} labels and "
                f"{None if images is None else len(images)} images don't match"
            )
        self.paths = list(paths)
        self.labels = labels.long() if labels is not None else None
        self.size = size
        self.channels = channels
        self.augment = augment
        self.crop_padding = crop_padding
        self.images = images
        self.prepare = prepare
        self.set_normalization(mean, std)

    def set_normalization(self, mean: Tensor, std: Tensor) -> None:
        """Use these per-channel statistics (pixel values in [0, 1]) from now on."""
        self.mean = mean.detach().float().reshape(-1, 1, 1).clone()
        self.std = std.detach().float().reshape(-1, 1, 1).clone()

    def __len__(self) -> int:
        return len(self.paths)

    def raw(self, index: int) -> Tensor:
        """The decoded, resized uint8 image ``index`` before augmentation and normalization."""
        if self.images is not None:
            return self.images[index]
        return read_image(self.paths[index], self.size, self.channels, self.prepare)

    def random_crop_flip(self, image: Tensor) -> Tensor:
        """Pad with zeros, crop a random window of the original size, flip horizontally with probability 0.5."""
        p = self.crop_padding
        if p > 0:
            height, width = image.shape[-2:]
            top, left = torch.randint(0, 2 * p + 1, (2,)).tolist()
            image = F.pad(image, (p, p, p, p))[:, top : top + height, left : left + width]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image

    def __getitem__(self, index: int) -> tuple[Tensor, ...]:
        image = self.raw(index).float().div_(255.0)
        if self.augment:
            image = self.random_crop_flip(image)
        image = (image - self.mean) / self.std
        if self.labels is None:
            return (image.contiguous(),)
        return image.contiguous(), self.labels[index].clone()
