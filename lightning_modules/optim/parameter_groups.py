"""Optimizer parameter groups: weight decay or not, per learning-rate part of the network.

``param_groups`` splits a network's trainable parameters into a weight-decay group and a no-decay group (per part,
when the fine-tuning arguments give parts their own learning rates); ``apply_lr_factors`` multiplies each part's
learning rate once the optimizer exists.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from torch import nn
from torch.optim import Optimizer

from lightning_modules.compat import BATCH_AND_INSTANCE_NORM

NORM_LAYERS: tuple[type[nn.Module], ...] = (
    BATCH_AND_INSTANCE_NORM,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


def param_groups(
    model: nn.Module,
    lr_factors: Mapping[str, tuple[float, str]] | None = None,
    also_frozen: Collection[nn.Parameter] = (),
) -> list[dict[str, Any]]:
    """Split trainable parameters into a weight-decay group and a no-decay group, per learning-rate part.

    Biases, norm-layer weights and any other parameter with fewer than two dimensions get ``weight_decay=0``;
    every other weight keeps the optimizer's configured weight decay (the group carries no ``weight_decay`` key,
    so the optimizer's own default applies).

    ``lr_factors`` (parameter name -> (factor, part label), from ``LearningRateParts.factors``) splits the groups
    further by part: a group named "<part>/decay" carries ``lr_factor`` (applied by ``apply_lr_factors`` once the
    optimizer exists). ``also_frozen``: parameters without ``requires_grad`` that go into the groups anyway (frozen
    now, unfrozen on schedule: the optimizer skips a parameter without a gradient, and the schedule built now covers
    it from the first step).
    """
    frozen_ids = {id(p) for p in also_frozen}
    names = {id(p): n for n, p in model.named_parameters()}
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    seen: set[int] = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not (param.requires_grad or id(param) in frozen_ids):
                continue
            seen.add(id(param))
            kind = "no_decay" if isinstance(module, NORM_LAYERS) or name.endswith("bias") or param.ndim < 2 else "decay"
            factor, part = (lr_factors or {}).get(names.get(id(param), ""), (1.0, ""))
            key = (part, kind)
            if key not in groups:
                group: dict[str, Any] = {"params": [], "name": f"{part}/{kind}" if part else kind}
                if kind == "no_decay":
                    group["weight_decay"] = 0.0
                if factor != 1.0:
                    group["lr_factor"] = factor
                groups[key] = group
            groups[key]["params"].append(param)
    # the default layout first ("decay", then "no_decay"), then each part in the network's order
    parts = list(dict.fromkeys(part for part, _ in groups))
    order = sorted(groups, key=lambda key: (key[0] != "", parts.index(key[0]), key[1] == "no_decay"))
    return [groups[key] for key in order]


def apply_lr_factors(optimizer: Optimizer) -> Optimizer:
    """Multiply the learning rate of each group carrying ``lr_factor`` by it (once, before a schedule is built)."""
    for group in optimizer.param_groups:
        factor = group.get("lr_factor")
        if factor is not None and not group.get("lr_factor_applied"):
            group["lr"] = group["lr"] * factor
            group["lr_factor_applied"] = True
    return optimizer


__all__ = ["apply_lr_factors", "param_groups"]
