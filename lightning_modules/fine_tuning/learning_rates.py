"""Learning rates per part of a network: multipliers by name pattern and layer-wise decay over a stack of blocks.

``LearningRateParts`` gives every parameter of a network a factor of the optimizer's learning rate and a label that
names its part (the group names the LR monitor shows: ``lr/backbone/decay``). ``lightning_modules.optim.param_groups``
groups parameters by (part, weight decay or not); the factor multiplies the group's learning rate once, when the
optimizer is built, so every schedule (which scales each group's own base rate) keeps the ratios for the whole run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from torch import nn

from lightning_modules.fine_tuning.initial_weights import matches


def label_of(pattern: str) -> str:
    """A pattern as a metric-name-safe label: "blocks.*" -> "blocks", "encoder.layer.0" -> "encoder.layer.0"."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", pattern).strip("._")
    return label or "part"


def block_stack(network: nn.Module) -> tuple[str, list[str]]:
    """(name, child names) of the network's stack of blocks: the ``nn.ModuleList`` or ``nn.Sequential`` with the
    most parameters whose children (at least two) are blocks (modules with submodules of their own), e.g. GPT's
    ``blocks``, a transformer encoder's ``layers``, ConvNet's ``stages``. Raises ``ValueError`` when there is none."""
    best: tuple[int, str, list[str]] | None = None
    for name, module in network.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        children = list(module.named_children())
        if len(children) < 2 or not all(list(child.children()) for _, child in children):
            continue
        size = sum(p.numel() for p in module.parameters())
        if best is None or size > best[0]:
            best = (size, name, [child_name for child_name, _ in children])
    if best is None:
        raise ValueError(
            f"layerwise_lr_decay: {type(network).__name__} has no stack of blocks (an nn.ModuleList or nn.Sequential of "
            "modules with submodules); use lr_multipliers to set the learning rate of its parts"
        )
    return best[1], best[2]


class LearningRateParts:
    """The learning-rate factor and part label of each parameter of a network.

    Args:
        lr_multipliers: Name pattern -> factor of the optimizer's learning rate, matched (``fnmatch``) against
            parameter names of the network, a pattern without wildcards also naming everything under it
            ("backbone": 0.1). The first pattern that matches wins; unmatched parameters get 1.
        layerwise_lr_decay: Factor d in (0, 1] per block of the network's stack of blocks (``block_stack``), counted
            from the top: the last block gets d, the one below d**2, ..., parameters before the stack (embeddings,
            stem) d**(n+1), parameters after it (final norm, head) 1. Multiplies with ``lr_multipliers``.
    """

    def __init__(self, lr_multipliers: Mapping[str, float] | None = None, layerwise_lr_decay: float | None = None) -> None:
        self.lr_multipliers = dict(lr_multipliers or {})
        for pattern, factor in self.lr_multipliers.items():
            if not isinstance(factor, (int, float)) or factor < 0:
                raise ValueError(f"lr_multipliers: the factor of {pattern!r} must be a number >= 0, got {factor!r}")
        if layerwise_lr_decay is not None and not 0.0 < layerwise_lr_decay <= 1.0:
            raise ValueError(f"layerwise_lr_decay must be in (0, 1], got {layerwise_lr_decay}")
        self.layerwise_lr_decay = layerwise_lr_decay

    @property
    def active(self) -> bool:
        return bool(self.lr_multipliers) or self.layerwise_lr_decay is not None

    def check(self, network: nn.Module) -> None:
        """Raise ``ValueError`` naming a pattern that matches no parameter of ``network`` (a typo would otherwise
        train that part at the full rate without a word)."""
        names = [name for name, _ in network.named_parameters()]
        for pattern in self.lr_multipliers:
            if not any(matches(name, [pattern]) for name in names):
                children = [name for name, _ in network.named_children()]
                raise ValueError(
                    f"lr_multipliers: {pattern!r} matches no parameter of {type(network).__name__} "
                    f"(its parts: {children})"
                )
        if self.layerwise_lr_decay is not None:
            block_stack(network)

    def factors(self, network: nn.Module) -> dict[str, tuple[float, str]]:
        """Parameter name (in ``network``) -> (factor, part label); the label is "" for a factor-1 parameter outside
        every pattern and the stack."""
        depth: dict[str, int] = {}
        stack_name, blocks = ("", [])
        if self.layerwise_lr_decay is not None:
            stack_name, blocks = block_stack(network)
        seen_stack = False
        out: dict[str, tuple[float, str]] = {}
        for name, _ in network.named_parameters():
            factor, labels = 1.0, []
            for pattern, multiplier in self.lr_multipliers.items():
                if matches(name, [pattern]):
                    factor, labels = float(multiplier), [label_of(pattern)]
                    break
            if self.layerwise_lr_decay is not None:
                decay = self.layerwise_lr_decay
                prefix = f"{stack_name}." if stack_name else ""
                inside = name.startswith(prefix) and name[len(prefix):].split(".", 1)[0] in blocks
                if inside:
                    seen_stack = True
                    index = blocks.index(name[len(prefix):].split(".", 1)[0])
                    depth[name] = len(blocks) - index
                    labels.append(f"layer{index + 1}")
                elif not seen_stack:
                    depth[name] = len(blocks) + 1
                    labels.append("layer0")
                factor *= decay ** depth.get(name, 0)
            out[name] = (factor, "/".join(labels))
        return out


__all__ = ["LearningRateParts", "block_stack", "label_of"]
