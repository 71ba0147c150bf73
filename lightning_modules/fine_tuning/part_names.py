"""Names a network gives its parts, so one recipe's fine-tuning arguments fit a whole family of networks.

A pretrained Hugging Face image classifier keeps its backbone under a name that depends on the architecture
(``model.vit``, ``model.resnet``, ``model.convnext``, ...). A network that declares ``part_names`` (for example
``{"backbone": "model.vit", "head": "model.classifier"}``) lets ``freeze``, ``unfreeze_at_epoch`` and
``lr_multipliers`` say ``backbone`` and ``head``: a pattern whose first dotted component is such a name is read as
the module name it stands for (``backbone.encoder.layer.0`` -> ``model.vit.encoder.layer.0``). Every other pattern is
matched as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

from torch import nn

T = TypeVar("T")


@runtime_checkable
class NamesItsParts(Protocol):
    """A network with ``part_names``: a short name per part -> the module name of that part in the network."""

    part_names: Mapping[str, str]


def part_names_of(network: nn.Module) -> Mapping[str, str]:
    """The network's ``part_names`` (empty when it declares none)."""
    names = getattr(network, "part_names", None)
    return names if isinstance(names, Mapping) else {}


def resolve_part_name(network: nn.Module, pattern: str) -> str:
    """``pattern`` with a leading part name replaced by the module name it stands for."""
    first, dot, rest = pattern.partition(".")
    target = part_names_of(network).get(first)
    return pattern if target is None else target + dot + rest


def resolve_keys(network: nn.Module, mapping: Mapping[str, T] | None) -> dict[str, T] | None:
    """``mapping`` with each key read by ``resolve_part_name`` (``None`` stays ``None``)."""
    if mapping is None:
        return None
    return {resolve_part_name(network, key): value for key, value in mapping.items()}


def resolve_patterns(network: nn.Module, patterns: Any) -> Any:
    """A list of patterns read by ``resolve_part_name``; anything else returned as it is."""
    if isinstance(patterns, (list, tuple)):
        return [resolve_part_name(network, p) if isinstance(p, str) else p for p in patterns]
    return patterns
