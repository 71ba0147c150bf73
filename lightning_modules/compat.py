"""The one place where ``lightning_modules`` touches private names: three of torch, none of Lightning.

Every name below is private (a leading underscore) in the library that owns it and may change in any release. Code
elsewhere in ``lightning_modules`` calls the small functions of this module instead (``tests/test_structure.py``
fails when a private name appears anywhere else), and ``tests/lightning_modules/test_compat.py`` probes each one
against the installed versions. The recipes' own private names of Lightning live in ``recipes/compat.py``.

``PRIVATE_NAMES`` lists what each function relies on, for the probes and for the audit of an upgrade.
"""

from __future__ import annotations

import torch
from torch import nn

# torch's common base of BatchNorm*d, InstanceNorm*d and SyncBatchNorm (``nn.modules.batchnorm._NormBase``)
BATCH_AND_INSTANCE_NORM: type[nn.Module] = nn.modules.batchnorm._NormBase

PRIVATE_NAMES: dict[str, str] = {
    "is_compiled_in_place": "torch.nn.Module._compiled_call_impl (set by Module.compile())",
    "optimizer_has_stepped": "torch.optim.Optimizer._opt_called (set by the step wrapper of an LR scheduler)",
    "BATCH_AND_INSTANCE_NORM": "torch.nn.modules.batchnorm._NormBase",
}


# --- lightning_modules ----------------------------------------------------------------------------------------
def is_compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module.compile()`` (in place, parameter names unchanged) has been called on ``module``."""
    return getattr(module, "_compiled_call_impl", None) is not None


def optimizer_has_stepped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` has run: it holds state, or the step wrapper that an LR scheduler installs has
    counted a call (plain SGD keeps no state)."""
    return bool(optimizer.state) or bool(getattr(optimizer, "_opt_called", False))


__all__ = [
    "BATCH_AND_INSTANCE_NORM", "is_compiled_in_place",
    "optimizer_has_stepped", "PRIVATE_NAMES",
]
