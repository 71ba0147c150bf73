"""Generated in-memory classification data: Gaussian blobs around random class centres, any width or image shape."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from datamodules.base import BaseDataModule


def make_blobs(
    n_samples: int, in_features: int, n_classes: int, separation: float, seed: int
) -> tuple[Tensor, Tensor]:
    """Features ``(n_samples, in_features)`` float32 and labels ``(n_samples,)`` int64.

    Each class has a centre drawn from ``N(0, separation^2 / in_features)`` per feature (so centres lie about
    ``separation`` apart whatever the width); each sample is its class centre plus ``N(0, 1)`` noise per feature.
    Labels cycle through the classes, so every class has ``n_samples // n_classes`` or one more samples.
    """
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, in_features, generator=generator) * (separation / math.sqrt(in_features))
    labels = torch.arange(n_samples) % n_classes
    labels = labels[torch.randperm(n_samples, generator=generator)]
    noise = torch.randn(n_samples, in_features, generator=generator)
    # the noise is scaled so a linear classifier cannot be perfect; the task stays learnable at any width
    features = centres[labels] * math.sqrt(in_features) / 4.0 + noise
    return features.float(), labels.long()


class SyntheticDataModule(BaseDataModule):
    """Generated classification data kept in memory: Gaussian blobs, as vectors or as images.

    For benchmarks and tests that need data of a given shape and size without files: an MLP 784-512-512-10 on
    ``SyntheticDataModule(in_features=784, n_classes=10)`` or a ConvNet on ``image_shape=[3, 32, 32]``. Samples
    are seeded; no preprocessing is fitted (the features are already centred with unit noise).

    The other arguments (``test_fraction``, ``seed``, the loader options) are ``BaseDataModule``'s, passed on through
    ``**kwargs``; ``seed`` also seeds the generated samples.

    Args:
        n_samples: Total number of samples over all splits.
        in_features: Width of one sample (ignored when ``image_shape`` is given: its product is the width).
        n_classes: Number of classes, at least 2.
        image_shape: Shape of one sample as an image, e.g. ``[3, 32, 32]`` (channels, height, width); ``null``
            gives vectors of ``in_features``.
        separation: Distance scale between class centres; smaller is harder.
        batch_size: Samples per batch.
        val_fraction: Fraction of the samples held out for validation.
    """

    save_init_arguments = True

    def __init__(
        self,
        n_samples: int = 10_000,
        in_features: int = 784,
        n_classes: int = 10,
        image_shape: list[int] | None = None,
        separation: float = 3.0,
        batch_size: int = 256,
        val_fraction: float = 0.1,
        **kwargs: Any,
    ) -> None:
        if n_classes < 2:
            raise ValueError(f"SyntheticDataModule: n_classes must be >= 2, got {n_classes}")
        if n_samples < n_classes:
            raise ValueError(f"SyntheticDataModule: n_samples ({n_samples}) must be >= n_classes ({n_classes})")
        if image_shape is not None and (len(image_shape) == 0 or any(int(s) < 1 for s in image_shape)):
            raise ValueError(f"SyntheticDataModule: image_shape must be positive sizes, got {image_shape}")
        if image_shape is None and in_features < 1:
            raise ValueError(f"SyntheticDataModule: in_features must be >= 1, got {in_features}")
        if separation < 0:
            raise ValueError(f"SyntheticDataModule: separation must be >= 0, got {separation}")
        super().__init__(batch_size=batch_size, val_fraction=val_fraction, **kwargs)
        self.n_samples = n_samples
        self.n_classes = n_classes
        self.image_shape = [int(s) for s in image_shape] if image_shape is not None else None
        self._in_features = math.prod(self.image_shape) if self.image_shape is not None else in_features
        self.separation = separation

    @property
    def num_classes(self) -> int:
        return self.n_classes

    @property
    def in_features(self) -> int:
        """Width of one sample (the product of ``image_shape`` for images)."""
        return self._in_features

    def load(self) -> tuple[Tensor, Tensor]:
        features, labels = make_blobs(self.n_samples, self._in_features, self.n_classes, self.separation, self.seed)
        if self.image_shape is not None:
            features = features.reshape(self.n_samples, *self.image_shape)
        return features, labels
