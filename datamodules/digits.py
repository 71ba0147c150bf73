"""scikit-learn's bundled 8x8 handwritten digits: 1,797 grey-level images, 10 classes, no download."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor
from torch.utils.data import Dataset

from datamodules.base import BaseDataModule
from datamodules.preprocessing import Standardizer
from datamodules.tensor_dataset import BatchedTensorDataset


def load_digit_images() -> tuple[Tensor, Tensor]:
    """All 1,797 digits as images ``(N, 1, 8, 8)`` float32 (raw grey levels 0..16) and labels ``(N,)`` int64.

    scikit-learn ships the data inside the package, so nothing is downloaded; it is imported here, not at module
    import, because importing it costs start-up time.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "DigitsDataModule needs scikit-learn (it ships the digits data): pip install 'loopwise[recipes]' "
            "(or pip install scikit-learn)"
        ) from err
    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    return images, labels


def shift_images(images: Tensor, max_shift: int, fill: float) -> Tensor:
    """Each image of ``(N, C, H, W)`` moved by its own random whole number of pixels, ``-max_shift..max_shift``
    along each axis, the uncovered border filled with ``fill``.

    The shifts are drawn on the CPU from torch's global generator (seeded by ``seed_everything``, saved in the
    recipes' checkpoints), so a run draws the same shifts whatever its device or thread count, and a resumed run
    draws what an uninterrupted one would.
    """
    n, _, height, width = images.shape
    offsets = torch.randint(-max_shift, max_shift + 1, (n, 2)).to(images.device)
    padded = torch.nn.functional.pad(images, (max_shift,) * 4, value=fill)
    rows = (max_shift - offsets[:, :1]) + torch.arange(height, device=images.device)  # (N, H)
    cols = (max_shift - offsets[:, 1:]) + torch.arange(width, device=images.device)  # (N, W)
    sample = torch.arange(n, device=images.device)[:, None, None]
    # advanced indices around a slice: the result is (N, H, W, C)
    return padded[sample, :, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


class ShiftedDigits(BatchedTensorDataset):
    """The train images, each shifted at random (``shift_images``) every time a batch is read; labels unchanged.

    Args:
        images: Preprocessed images, ``(N, 1, 8, 8)`` or flattened ``(N, 64)``; batches keep that shape.
        labels: Class ids ``(N,)``.
        max_shift: Largest shift in pixels along each axis.
        fill: Value of the pixels uncovered by a shift (a blank pixel after preprocessing).
    """

    def __init__(self, images: Tensor, labels: Tensor, max_shift: int, fill: float) -> None:
        super().__init__(images, labels)
        self.max_shift = max_shift
        self.fill = fill

    def __getitems__(self, indices: Any) -> tuple[Tensor, ...]:
        images, labels = super().__getitems__(indices)
        shifted = shift_images(images.reshape(-1, 1, 8, 8), self.max_shift, self.fill)
        return shifted.reshape(images.shape), labels


class DigitsDataModule(BaseDataModule):
    """scikit-learn's 8x8 handwritten digits (1,797 images of the digits 0-9), in memory.

    The split is stratified and seeded. Pixels are standardized with one global mean and standard deviation over
    all pixels of the train split (not per pixel: the border pixels are constant 0 and a per-pixel std would divide
    by ~0); val and test use the same train statistics. Inputs are float32 images ``(N, 1, 8, 8)`` for CNNs, or
    ``(N, 64)`` vectors with ``flatten`` for an MLP; labels are int64 class ids 0-9.

    The other arguments (``batch_size``, ``seed``, the loader options) are ``BaseDataModule``'s, passed on through
    ``**kwargs``.

    Args:
        flatten: Give each sample as a vector of 64 pixels instead of a 1x8x8 image.
        val_fraction: Fraction of the images held out for validation (stratified by digit).
        test_fraction: Fraction of the images held out for testing (stratified by digit).
        max_shift: Augmentation of the train split: every time a train batch is read, each image moves by a random
            whole number of pixels, up to ``max_shift`` along each axis (the uncovered border blank). 0 (the
            default) turns it off; val, test and predict batches are never shifted.
    """

    save_init_arguments = True

    def __init__(
        self,
        flatten: bool = False,
        *,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        max_shift: int = 0,
        **kwargs: Any,
    ) -> None:
        if not 0 <= max_shift < self.image_size:
            raise ValueError(f"DigitsDataModule: max_shift must be in [0, {self.image_size - 1}], got {max_shift}")
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, **kwargs)
        self.flatten = flatten
        self.max_shift = max_shift
        self.standardizer = Standardizer()

    #: Number of classes: 10 (the digits 0-9).
    num_classes: ClassVar[int] = 10
    #: Width of one flattened sample: 64 pixels.
    in_features: ClassVar[int] = 64
    #: Channels of one image: 1 (grey levels).
    in_channels: ClassVar[int] = 1
    #: Height and width of one image: 8.
    image_size: ClassVar[int] = 8

    @property
    def class_names(self) -> list[str]:
        """Name of each class id: the digits "0" to "9"."""
        return [str(digit) for digit in range(10)]

    def load(self) -> tuple[Tensor, Tensor]:
        return load_digit_images()

    def fit_preprocessing(self, train_images: Tensor) -> None:
        # one column of all train pixels: a single global mean and std
        self.standardizer.fit(train_images.reshape(-1, 1))

    def preprocess(self, images: Tensor) -> Tensor:
        scaled = self.standardizer.transform(images)
        return scaled.flatten(1) if self.flatten else scaled

    def on_device(self, dataset: Dataset) -> Dataset:
        moved = super().on_device(dataset)  # a plain BatchedTensorDataset on another device: shift it there too
        if isinstance(dataset, ShiftedDigits) and not isinstance(moved, ShiftedDigits):
            return ShiftedDigits(*moved.tensors, dataset.max_shift, dataset.fill)  # type: ignore[attr-defined]
        return moved

    def make_dataset(self, split: str, inputs: Tensor, targets: Tensor) -> Dataset:
        if split != "train" or self.max_shift == 0:
            return super().make_dataset(split, inputs, targets)
        blank = float(self.standardizer.transform(torch.zeros(1)))  # a raw 0 grey level, standardized
        return ShiftedDigits(self.preprocess(inputs), targets, self.max_shift, blank)
