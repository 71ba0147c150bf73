"""TabM: k MLPs in one, an efficient ensemble for tabular data.

Reference: Gorishniy, Kotelnikov, Babenko, "TabM: Advancing Tabular Deep Learning with Parameter-Efficient
Ensembling" (ICLR 2025, arXiv:2410.24210); the reference implementation is the ``tabm`` package. The hidden layers
are BatchEnsemble layers (Wen, Tran, Ba, ICLR 2020): the k members share one weight matrix W, and member i has its
own input scaling r_i, output scaling s_i and bias b_i. The output heads are not shared.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_modules.models.mlp import ACTIVATIONS
from lightning_modules.models.numeric_embeddings import PeriodicEmbeddings


class BatchEnsembleLinear(nn.Module):
    """A Linear layer shared by k members with per-member scalings: y_i = ((x_i * r_i) W^T) * s_i + b_i.

    Input and output ``(batch, k, features)``. W is initialised as ``nn.Linear``'s (uniform in +-1/sqrt(in)), the
    biases as one such draw copied to every member, s as ones and r as ``scaling_init`` says.

    Args:
        in_features: Width of each member's input.
        out_features: Width of each member's output.
        k: Number of ensemble members.
        scaling_init: Initial r: "random-signs" (each entry +1 or -1 at random: the members differ from the start;
            TabM's first layer) or "ones" (the members differ only by what they receive).
    """

    def __init__(
        self, in_features: int, out_features: int, k: int, scaling_init: Literal["random-signs", "ones"] = "ones"
    ) -> None:
        super().__init__()
        if scaling_init not in ("random-signs", "ones"):
            raise ValueError(
                f"BatchEnsembleLinear: scaling_init must be 'random-signs' or 'ones', got {scaling_init!r}"
            )
        self.in_features, self.out_features, self.k = in_features, out_features, k
        self.scaling_init = scaling_init
        #: the shared weight W, ``(out_features, in_features)``
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        #: per-member input scaling r, ``(k, in_features)``
        self.r = nn.Parameter(torch.empty(k, in_features))
        #: per-member output scaling s, ``(k, out_features)``
        self.s = nn.Parameter(torch.empty(k, out_features))
        #: per-member bias b, ``(k, out_features)``
        self.bias = nn.Parameter(torch.empty(k, out_features))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """W and the (shared at first) bias uniform in +-1/sqrt(in_features); s ones; r per ``scaling_init``."""
        bound = 1 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        self.bias.copy_(torch.empty(self.out_features).uniform_(-bound, bound).expand(self.k, -1))
        nn.init.ones_(self.s)
        if self.scaling_init == "random-signs":
            self.r.copy_(torch.randint(0, 2, self.r.shape).mul(2).sub(1))
        else:
            nn.init.ones_(self.r)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, k, in_features)`` to ``(batch, k, out_features)``."""
        return F.linear(x * self.r, self.weight) * self.s + self.bias


class LinearEnsemble(nn.Module):
    """k independent Linear layers, member i applied to ``x[:, i]``: input ``(batch, k, in)``, output
    ``(batch, k, out)``. Each initialised as ``nn.Linear`` (uniform in +-1/sqrt(in)).

    Args:
        in_features: Width of each member's input.
        out_features: Width of each member's output.
        k: Number of ensemble members.
    """

    def __init__(self, in_features: int, out_features: int, k: int) -> None:
        super().__init__()
        self.in_features, self.out_features, self.k = in_features, out_features, k
        #: member i's weight ``weight[i]``, ``(in_features, out_features)``
        self.weight = nn.Parameter(torch.empty(k, in_features, out_features))
        #: member i's bias ``bias[i]``, ``(out_features,)``
        self.bias = nn.Parameter(torch.empty(k, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weights and biases uniform in +-1/sqrt(in_features), independently per member."""
        bound = 1 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, k, in_features)`` to ``(batch, k, out_features)``."""
        return torch.bmm(x.transpose(0, 1), self.weight).transpose(0, 1) + self.bias


def first_adapter(k: int, in_features: int, embedded: int, d_embedding: int) -> Tensor:
    """The first per-member input scaling r of TabM, ``(k, width)``, drawn per input column, as the reference
    implementation (``tabm_reference``) draws it per feature: one value per column, shared by the ``d_embedding``
    positions of each of the first ``embedded`` (embedded numeric) columns. Random signs +-1 without embeddings;
    N(0, 1) with them (the reference's ``first_adapter_init = "normal"`` when numerical embeddings are used)."""
    if embedded == 0:
        return torch.randint(0, 2, (k, in_features)).float().mul(2).sub(1)
    values = torch.randn(k, in_features)
    repeats = torch.tensor([d_embedding] * embedded + [1] * (in_features - embedded))
    return values.repeat_interleave(repeats, dim=1)


class TabM(nn.Module):
    """TabM: an efficient ensemble of k MLPs sharing one backbone; returns the k members' outputs, not averaged.

    Use it with ``lightning_modules.ClassificationModule`` or ``RegressionModule``: they train every member on each
    batch (the training loss is the mean of the members' losses) and evaluate and predict with the ensemble (mean
    probability, mean prediction). The input row is copied to the k members at the first layer.

    ``arch="tabm"``: every hidden layer is a ``BatchEnsembleLinear`` (the first one's r drawn per input column by
    ``first_adapter``: random signs +-1, or N(0, 1) with embeddings, one value per embedded feature; the other r and
    all s ones). ``arch="mini"`` (TabM-mini): one per-member scaling r of the input (``first_adapter``), then a plain
    MLP shared by the members. Both end in k independent output heads (``LinearEnsemble``). Each hidden layer
    is Linear -> activation -> dropout.

    With ``embedding="periodic"`` the first ``numeric_features`` input columns (scaled numeric features) are
    embedded with ``PeriodicEmbeddings`` (lite: one Linear shared by the features), flattened and put in front of
    the rest of the row (missing indicators, one-hot blocks), which passes as it is.

    Defaults are TabM's (k=32, 3 hidden layers of 512, dropout 0.1); the paper trains them with AdamW, lr 0.002,
    weight decay 0.0003, and tunes the width, depth, dropout and ``frequency_scale``.

    Args:
        in_features: Width of the input row (the data module's ``in_features``).
        out_features: Width of each member's output: number of classes, 1 for binary or regression.
        numeric_features: Number of leading input columns that are scaled numeric features (the data module's
            ``numeric_features``); embedded when ``embedding="periodic"``, else unused.
        k: Number of ensemble members.
        hidden_sizes: Width of each hidden layer, in order.
        dropout: Dropout probability after each hidden activation (0 disables it).
        activation: Activation after each hidden layer: relu, gelu, silu, tanh or leaky_relu.
        embedding: "periodic" to embed the numeric features with ``PeriodicEmbeddings``; null feeds them as they are.
        d_embedding: Width of each numeric feature's embedding.
        n_frequencies: Frequencies per numeric feature of the periodic embeddings.
        frequency_scale: Initial scale of the frequencies of the periodic embeddings (see ``PeriodicEmbeddings``).
        arch: "tabm" (BatchEnsemble in every hidden layer) or "mini" (only the first scaling is per member).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        numeric_features: int = 0,
        k: int = 32,
        hidden_sizes: list[int] = [512, 512, 512],  # noqa: B006 - read-only default, shown in --help
        dropout: float = 0.1,
        activation: Literal["relu", "gelu", "silu", "tanh", "leaky_relu"] = "relu",
        embedding: Literal["periodic"] | None = None,
        d_embedding: int = 16,
        n_frequencies: int = 48,
        frequency_scale: float = 0.01,
        arch: Literal["tabm", "mini"] = "tabm",
    ) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"TabM: in_features and out_features must be >= 1, got {in_features}, {out_features}")
        if not 0 <= numeric_features <= in_features:
            raise ValueError(
                f"TabM: numeric_features must be in [0, in_features={in_features}], got {numeric_features}"
            )
        if k < 1:
            raise ValueError(f"TabM: k (the number of ensemble members) must be >= 1, got {k}")
        if not hidden_sizes or any(h < 1 for h in hidden_sizes):
            raise ValueError(f"TabM: hidden_sizes needs at least one layer, each >= 1, got {list(hidden_sizes)}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TabM: dropout must be in [0, 1), got {dropout}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"TabM: unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        if embedding not in ("periodic", None):
            raise ValueError(f"TabM: embedding must be 'periodic' or null, got {embedding!r}")
        if embedding == "periodic" and numeric_features == 0:
            raise ValueError(
                "TabM: embedding='periodic' needs numeric_features >= 1 (the number of leading numeric input columns)"
            )
        if arch not in ("tabm", "mini"):
            raise ValueError(f"TabM: arch must be 'tabm' or 'mini', got {arch!r}")
        self.in_features, self.out_features, self.k = in_features, out_features, k
        self.numeric_features, self.arch = numeric_features, arch
        #: the numeric features' ``PeriodicEmbeddings``, or ``None``
        self.embeddings = (
            PeriodicEmbeddings(numeric_features, d_embedding, n_frequencies, frequency_scale, lite=True)
            if embedding == "periodic"
            else None
        )
        width = in_features + (numeric_features * (d_embedding - 1) if self.embeddings is not None else 0)
        embedded = numeric_features if self.embeddings is not None else 0
        first_scaling = first_adapter(k, in_features, embedded, d_embedding)
        #: TabM-mini's per-member input scaling r, ``(k, width)`` (see ``first_adapter``); ``None`` for arch="tabm"
        self.adapter = nn.Parameter(first_scaling) if arch == "mini" else None
        blocks: list[nn.Module] = []
        for i, hidden in enumerate(hidden_sizes):
            if arch == "tabm":
                linear: nn.Module = BatchEnsembleLinear(width, hidden, k, "random-signs" if i == 0 else "ones")
            else:
                linear = nn.Linear(width, hidden)
            block = [linear, ACTIVATIONS[activation]()] + ([nn.Dropout(dropout)] if dropout > 0 else [])
            if arch == "tabm" and i == 0:
                with torch.no_grad():
                    linear.r.copy_(first_scaling)  # type: ignore[union-attr]
            blocks.append(nn.Sequential(*block))
            width = hidden
        #: the hidden layers, each Linear (``BatchEnsembleLinear`` for arch="tabm") -> activation -> [dropout]
        self.backbone = nn.Sequential(*blocks)
        #: the k members' output layers
        self.head = LinearEnsemble(width, out_features, k)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, in_features)`` to the members' outputs ``(batch, k, out_features)``."""
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(
                f"TabM(in_features={self.in_features}) expects input of shape (batch, {self.in_features}), got "
                f"{tuple(x.shape)}: set in_features to the data's width"
            )
        if self.embeddings is not None:
            numeric = self.embeddings(x[:, : self.numeric_features]).flatten(1)
            x = torch.cat([numeric, x[:, self.numeric_features :]], dim=1)
        x = x.unsqueeze(1).expand(-1, self.k, -1)  # every member gets the row
        if self.adapter is not None:
            x = x * self.adapter
        return self.head(self.backbone(x))


__all__ = ["BatchEnsembleLinear", "LinearEnsemble", "TabM", "first_adapter"]
