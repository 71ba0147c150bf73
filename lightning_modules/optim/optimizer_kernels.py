"""Which kernel an optimizer runs: torch's fused one where the device has it, kept across a resume.

The choice belongs to the machine a run trains on, not to the checkpoint it resumes: ``Optimizer.load_state_dict``
copies every saved group setting, ``fused`` and ``foreach`` included, so without ``keep_kernel_on_load`` a checkpoint
written before fused CPU kernels were chosen would resume unfused (a silent 3-5x slower optimizer step), and one
written by a fused run would resume fused where this machine chose otherwise (``fused: false`` in the config, a
``16-mixed`` GradScaler that clips, a device without fused kernels).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch.optim import Optimizer

from lightning_modules.compat import optimizer_has_stepped

KERNEL_SETTINGS = ("fused", "foreach")
"""The parameter-group settings that choose an implementation, not an update: the update is the same to float
rounding whichever is set."""


def fused_where_supported(optimizer: Optimizer, device_type: str | None = None) -> Optimizer:
    """The same optimizer rebuilt with ``fused=True`` when that is possible and was not chosen against.

    Applies when every parameter is a floating-point tensor on one device (``device_type`` if given) whose fused
    kernels torch has (CUDA, and the CPU since torch 2.4), the optimizer class takes a ``fused`` argument (Adam,
    AdamW, SGD, Adagrad), and its ``fused`` and ``foreach`` are unset (``None``). The rebuilt optimizer has the same
    class, parameter groups and arguments; it has no state yet (this runs before the first step). Anything else, or a
    device torch refuses, returns ``optimizer``. On the CPU the fused AdamW step of the spiral MLP takes ~140 us
    instead of ~410 us, of a 784-512-512-10 MLP ~0.4 ms instead of ~2.1 ms (measured alone: ``benchmarks/README.md``,
    issue 32 stop 42); the updates agree with torch's default implementation to float rounding (2e-7 after 300
    steps).
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if not params:
        return optimizer
    device = params[0].device.type
    if device_type is not None and device != device_type:
        return optimizer
    if any(p.device.type != device or not p.is_floating_point() for p in params):
        return optimizer
    defaults = optimizer.defaults
    if "fused" not in defaults or defaults.get("fused") is not None or defaults.get("foreach") is not None:
        return optimizer
    if optimizer_has_stepped(optimizer):
        return optimizer
    accepted = inspect.signature(type(optimizer).__init__).parameters
    if "fused" not in accepted:
        return optimizer
    kwargs = {k: v for k, v in defaults.items() if k in accepted and k != "params"}
    kwargs["fused"] = True
    kwargs.pop("foreach", None)
    groups = [{k: v for k, v in group.items() if k not in defaults or v != defaults[k] or k == "params"}
              for group in optimizer.param_groups]
    try:
        return type(optimizer)(groups, **kwargs)
    except (RuntimeError, ValueError, TypeError):  # e.g. a device or dtype the fused kernels do not support
        return optimizer


def keep_kernel_on_load(optimizer: Optimizer) -> Optimizer:
    """Make ``optimizer.load_state_dict`` keep this optimizer's own kernel settings (``KERNEL_SETTINGS``) instead of
    the saved ones: the learning rates, betas, weight decay and state still come from the checkpoint. A pre-hook
    (torch's public ``register_load_state_dict_pre_hook``); registering it twice changes nothing. Returns
    ``optimizer``."""

    def own_kernel(live: Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        saved_groups = state_dict.get("param_groups", [])
        if len(saved_groups) != len(live.param_groups):
            return state_dict  # torch names the mismatch itself
        groups = []
        for saved, group in zip(saved_groups, live.param_groups):
            saved = dict(saved)
            for key in KERNEL_SETTINGS:
                if key in group:
                    saved[key] = group[key]
            groups.append(saved)
        return {**state_dict, "param_groups": groups}

    optimizer.register_load_state_dict_pre_hook(own_kernel)
    return optimizer


__all__ = ["KERNEL_SETTINGS", "fused_where_supported", "keep_kernel_on_load"]
