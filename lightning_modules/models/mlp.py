"""Multi-layer perceptron."""

from __future__ import annotations

from typing import Literal

from torch import Tensor, nn

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,
    "silu": nn.SiLU,
    "tanh": nn.Tanh,
    "leaky_relu": nn.LeakyReLU,
}
NORMS: dict[str, type[nn.Module]] = {"batch": nn.BatchNorm1d, "layer": nn.LayerNorm}


class MLP(nn.Module):
    """A stack of Linear -> [norm] -> activation -> [dropout] blocks and a final Linear layer.

    Args:
        in_features: Width of the input (the data module's ``in_features``).
        out_features: Width of the output: number of classes, 1 for binary or regression.
        hidden_sizes: Width of each hidden layer, in order.
        activation: Activation after each hidden layer: relu, gelu, silu, tanh or leaky_relu.
        dropout: Dropout probability after each hidden activation (0 disables it).
        norm: Optional normalization after each hidden Linear: "batch" or "layer".
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        hidden_sizes: list[int] = [128, 128],  # noqa: B006 - read-only default, shown in --help
        activation: Literal["relu", "gelu", "silu", "tanh", "leaky_relu"] = "relu",
        dropout: float = 0.0,
        norm: Literal["batch", "layer"] | None = None,
    ) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"MLP: in_features and out_features must be >= 1, got {in_features}, {out_features}")
        if any(h < 1 for h in hidden_sizes):
            raise ValueError(f"MLP: every hidden size must be >= 1, got {list(hidden_sizes)}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP: dropout must be in [0, 1), got {dropout}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP: unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}")
        if norm is not None and norm not in NORMS:
            raise ValueError(f"MLP: unknown norm {norm!r}; choose one of {sorted(NORMS)} or null")
        self.in_features = in_features
        self.out_features = out_features
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers.append(nn.Linear(width, hidden))
            if norm is not None:
                layers.append(NORMS[norm](hidden))
            layers.append(ACTIVATIONS[activation]())
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, in_features)`` (or any ``(batch, ...)`` that flattens to it) to ``(batch, out_features)``."""
        if x.ndim > 2:
            x = x.flatten(1)
        return self.net(x)
