"""Gradient clipping by norm that keeps the norm it measures.

Lightning clips by norm with ``torch.nn.utils.clip_grad_norm_`` (its precision plugin's ``clip_grad_by_norm``) and
drops the total norm that call returns. The loop doctor needs that same norm (before clipping) on every step; a
second pass over every gradient to measure it again costs as much as the clipping itself on a large network. Where
the trainer's precision plugin clips the default way, ``clip_by_norm_measured`` makes the same call and returns the
norm; elsewhere (an fp16 GradScaler, FSDP, DeepSpeed, a plugin with its own clipping) it returns ``None`` and
Lightning's own path runs.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from torch import Tensor


def clips_by_norm_the_default_way(trainer: Any, clip_val: float | int | None, algorithm: Any) -> bool:
    """Whether ``trainer`` clips by norm (``gradient_clip_val`` > 0, algorithm "norm") through the default
    ``Precision.clip_grad_by_norm``: 32-bit, bf16-mixed and half precision without a GradScaler."""
    if not clip_val or clip_val <= 0:
        return False
    if algorithm is not None and str(getattr(algorithm, "value", algorithm)).lower() != "norm":
        return False
    plugin = getattr(trainer, "precision_plugin", None)
    if plugin is None or getattr(plugin, "scaler", None) is not None:
        return False
    return type(plugin).clip_grad_by_norm is Precision.clip_grad_by_norm and type(plugin).clip_gradients in (
        Precision.clip_gradients,
        MixedPrecision.clip_gradients,
    )


def clips_under_a_grad_scaler(trainer: Any) -> bool:
    """Whether ``trainer`` clips gradients (``gradient_clip_val`` > 0) under a GradScaler (``16-mixed``): Lightning
    then unscales the gradients itself before clipping, which an optimizer that unscales inside its own step
    (``fused=True``) does not allow (Lightning raises "does not allow for gradient clipping" at the first step)."""
    clip_val = getattr(trainer, "gradient_clip_val", None)
    plugin = getattr(trainer, "precision_plugin", None)
    return bool(clip_val) and float(clip_val) > 0 and getattr(plugin, "scaler", None) is not None


def clip_by_norm_measured(trainer: Any, optimizer: torch.optim.Optimizer, clip_val: float) -> Tensor:
    """Clip ``optimizer``'s gradients to total norm ``clip_val`` exactly as Lightning's default precision plugin
    does, and return the total norm before clipping (a 0-d tensor on the gradients' device; nothing is read back to
    the host). Call only where ``clips_by_norm_the_default_way`` says so."""
    parameters = list(trainer.precision_plugin.main_params(optimizer))
    return torch.nn.utils.clip_grad_norm_(parameters, float(clip_val))


__all__ = ["clip_by_norm_measured", "clips_by_norm_the_default_way", "clips_under_a_grad_scaler"]
