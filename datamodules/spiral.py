"""The k-class spiral of the annotated-loop article: 2-D points on interleaved arms, generated, no download."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

from datamodules.base import BaseDataModule
from datamodules.preprocessing import Standardizer
from datamodules.tensor_dataset import BatchedTensorDataset


def make_spiral(n_samples: int, n_classes: int, noise: float, seed: int) -> tuple[Tensor, Tensor]:
    """Points on ``n_classes`` spiral arms (features ``(n, 2)`` float32, labels ``(n,)`` int64).

    Arm ``k`` has radius ``r`` from 0 to 1 and angle ``4 r + 2 pi k / n_classes + noise * N(0, 1)``; with three
    classes this is the classic three-arm spiral. Samples are spread over the classes as evenly as possible.
    """
    generator = torch.Generator().manual_seed(seed)
    per_class = [n_samples // n_classes + (1 if k < n_samples % n_classes else 0) for k in range(n_classes)]
    xs, ys = [], []
    for k, m in enumerate(per_class):
        radius = torch.linspace(0.0, 1.0, m)
        angle = 4.0 * radius + 2.0 * math.pi * k / n_classes + noise * torch.randn(m, generator=generator)
        xs.append(torch.stack([radius * torch.sin(angle), radius * torch.cos(angle)], dim=1))
        ys.append(torch.full((m,), k, dtype=torch.long))
    return torch.cat(xs).float(), torch.cat(ys)


class SpiralDataModule(BaseDataModule):
    """The three-class spiral (or any number of arms), generated in memory from a seed.

    The other arguments (``batch_size``, ``val_fraction``, ``seed``, the loader options) are ``BaseDataModule``'s,
    passed on through ``**kwargs``; ``seed`` also seeds the generated points.

    Args:
        n_samples: Total number of points over all classes.
        n_classes: Number of spiral arms (classes), at least 2.
        noise: Standard deviation of the angular noise; larger values blur the arms.
        test_fraction: Fraction of the points held out for testing.
        standardize: Standardize the two features with train-split mean and std.
    """

    save_init_arguments = True

    def __init__(
        self,
        n_samples: int = 2000,
        n_classes: int = 3,
        noise: float = 0.2,
        *,
        test_fraction: float = 0.1,
        standardize: bool = True,
        **kwargs: Any,
    ) -> None:
        if n_classes < 2:
            raise ValueError(f"SpiralDataModule: n_classes must be >= 2, got {n_classes}")
        if n_samples < n_classes:
            raise ValueError(f"SpiralDataModule: n_samples ({n_samples}) must be >= n_classes ({n_classes})")
        if noise < 0:
            raise ValueError(f"SpiralDataModule: noise must be >= 0, got {noise}")
        super().__init__(test_fraction=test_fraction, **kwargs)
        self.n_samples = n_samples
        self.n_classes = n_classes
        self.noise = noise
        self.standardize = standardize
        self.standardizer = Standardizer()

    @property
    def num_classes(self) -> int:
        return self.n_classes

    @property
    def in_features(self) -> int:
        """Width of one sample: 2 (x, y)."""
        return 2

    def load(self) -> tuple[Tensor, Tensor]:
        return make_spiral(self.n_samples, self.n_classes, self.noise, self.seed)

    def fit_preprocessing(self, train_features: Tensor) -> None:
        if self.standardize:
            self.standardizer.fit(train_features)

    def preprocess(self, features: Tensor) -> Tensor:
        return self.standardizer.transform(features) if self.standardize else features

    def frame_data(self, frame: Any) -> tuple[Dataset, list[Any]]:
        """Raw points (a DataFrame with columns ``x`` and ``y``, as generated) standardized with the train split's
        statistics, with their row numbers."""
        if not self.datasets:
            self.setup()  # the generated data and its train-split statistics (deterministic from the seed)
        missing = [c for c in ("x", "y") if c not in frame.columns]
        if missing:
            raise ValueError(f"SpiralDataModule: the table lacks the column(s) {missing}; it needs x and y")
        points = torch.tensor(frame[["x", "y"]].to_numpy(dtype="float32"))
        return BatchedTensorDataset(self.preprocess(points)), list(range(len(points)))

    def raw_examples(self, count: int = 5) -> Any:
        """The first ``count`` generated points as a DataFrame with columns ``x`` and ``y``."""
        import pandas as pd

        points, _ = self.load()
        return pd.DataFrame(points[:count].double().numpy(), columns=["x", "y"])  # float64, as users pass them
