"""Periodic embeddings of numeric features (PLR), for MLPs on tables.

Reference: Gorishniy, Rubachev, Babenko, "On Embeddings for Numerical Features in Tabular Deep Learning" (NeurIPS
2022), in the "lite" form TabM uses (Gorishniy et al. 2024, "TabM: Advancing Tabular Deep Learning with
Parameter-Efficient Ensembling"; ``rtdl_num_embeddings.PeriodicEmbeddings(lite=True)``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class PeriodicEmbeddings(nn.Module):
    """Embed each numeric feature x_j as ReLU(Linear([cos(2 pi c_j x_j), sin(2 pi c_j x_j)])) (PLR).

    Every feature j has its own ``n_frequencies`` trainable frequencies c_j, initialised from
    N(0, ``frequency_scale``^2) truncated at 3 sigma (as ``rtdl_num_embeddings`` does). The 2 * ``n_frequencies``
    periodic values go through a Linear layer to ``d_embedding`` and a ReLU. Input ``(batch, n_features)`` of scaled
    numeric features; output ``(batch, n_features, d_embedding)`` (flatten it for an MLP).

    Args:
        n_features: Number of numeric features (input columns) embedded.
        d_embedding: Width of each feature's embedding.
        n_frequencies: Number of frequencies per feature (the periodic part has twice as many values: cos and sin).
        frequency_scale: Standard deviation of the frequencies' initialisation; the most important setting: too
            large a value fits noise, too small one gives nearly linear embeddings (0.01 is TabM's default; tune in
            [0.01, 10] on a log scale).
        lite: One Linear layer shared by all features (the "lite" form of TabM, fewer parameters); ``False``: one
            Linear layer per feature (the paper's PLR).
    """

    def __init__(
        self,
        n_features: int,
        d_embedding: int = 16,
        n_frequencies: int = 48,
        frequency_scale: float = 0.01,
        lite: bool = True,
    ) -> None:
        super().__init__()
        if n_features < 1 or d_embedding < 1 or n_frequencies < 1:
            raise ValueError(
                f"PeriodicEmbeddings: n_features, d_embedding and n_frequencies must be >= 1, got {n_features}, "
                f"{d_embedding}, {n_frequencies}"
            )
        if frequency_scale <= 0:
            raise ValueError(f"PeriodicEmbeddings: frequency_scale must be > 0, got {frequency_scale}")
        self.n_features = n_features
        self.d_embedding = d_embedding
        self.n_frequencies = n_frequencies
        self.frequency_scale = frequency_scale
        self.lite = lite
        #: the frequencies c, ``(n_features, n_frequencies)``
        self.frequencies = nn.Parameter(torch.empty(n_features, n_frequencies))
        width = 2 * n_frequencies
        if lite:
            #: the Linear layer after the periodic part: one shared ``nn.Linear`` (lite), else batched weights
            #: ``(n_features, 2 * n_frequencies, d_embedding)`` and biases ``(n_features, d_embedding)``
            self.linear: nn.Module = nn.Linear(width, d_embedding)
        else:
            self.weight = nn.Parameter(torch.empty(n_features, width, d_embedding))
            self.bias = nn.Parameter(torch.empty(n_features, d_embedding))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Frequencies from the 3-sigma truncated N(0, frequency_scale^2); the Linear part as ``nn.Linear`` (uniform
        in +-1/sqrt(2 * n_frequencies))."""
        sigma = self.frequency_scale
        nn.init.trunc_normal_(self.frequencies, 0.0, sigma, a=-3 * sigma, b=3 * sigma)
        if self.lite:
            self.linear.reset_parameters()
        else:
            bound = 1 / math.sqrt(2 * self.n_frequencies)
            nn.init.uniform_(self.weight, -bound, bound)
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, n_features)`` to ``(batch, n_features, d_embedding)``."""
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(
                f"PeriodicEmbeddings(n_features={self.n_features}) expects input of shape (batch, {self.n_features}), "
                f"got {tuple(x.shape)}"
            )
        v = 2 * math.pi * self.frequencies * x.unsqueeze(-1)  # (batch, n_features, n_frequencies)
        periodic = torch.cat([torch.cos(v), torch.sin(v)], dim=-1)
        if self.lite:
            out = self.linear(periodic)
        else:  # per feature: (n_features, batch, 2k) @ (n_features, 2k, d)
            out = torch.bmm(periodic.transpose(0, 1), self.weight).transpose(0, 1) + self.bias
        return torch.relu(out)


__all__ = ["PeriodicEmbeddings"]
