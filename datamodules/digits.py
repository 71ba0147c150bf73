"""scikit-learn's bundled 8x8 handwritten digits: 1,797 grey-level images, 10 classes, no download."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

from datamodules.base import BaseDataModule
from datamodules.preprocessing import Standardizer


def load_digit_images() -> tuple[Tensor, Tensor]:
    """All 1,797 digits as images ``(N, 1, 8, 8)`` float32 (raw grey levels 0..16) and labels ``(N,)`` int64.

    scikit-learn ships the data inside the package, so nothing is downloaded; it is imported here, not at module
    import, because importing it costs start-up time.
    """
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "DigitsDataModule needs scikit-learn (it ships the digits data): pip install scikit-learn"
        ) from err
    digits = load_digits()
    images = torch.as_tensor(digits.images, dtype=torch.float32).unsqueeze(1)
    labels = torch.as_tensor(digits.target, dtype=torch.long)
    return images, labels


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
    """

    save_init_arguments = True

    def __init__(
        self, flatten: bool = False, *, val_fraction: float = 0.15, test_fraction: float = 0.15, **kwargs: Any
    ) -> None:
        super().__init__(val_fraction=val_fraction, test_fraction=test_fraction, **kwargs)
        self.flatten = flatten
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
