"""Preprocessing whose statistics are fitted on the train split only."""

from __future__ import annotations

import torch
from torch import Tensor


class Standardizer:
    """Per-feature ``(x - mean) / std`` with mean and std from the data passed to ``fit`` (the train split).

    Constant features (std 0) are only centred.
    """

    def __init__(self) -> None:
        self.mean: Tensor | None = None
        self.std: Tensor | None = None

    def fit(self, features: Tensor) -> "Standardizer":
        """Learn mean and std per feature from ``features`` (samples along dimension 0)."""
        values = features.double()
        self.mean = values.mean(dim=0).to(features.dtype)
        std = values.std(dim=0, unbiased=False)
        self.std = torch.where(std > 0, std, torch.ones_like(std)).to(features.dtype)
        return self

    def transform(self, features: Tensor) -> Tensor:
        """Apply the fitted statistics."""
        if self.mean is None or self.std is None:
            raise RuntimeError("Standardizer.transform called before fit")
        return (features - self.mean) / self.std
