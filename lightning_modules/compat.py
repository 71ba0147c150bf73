"""The one place where ``lightning_modules`` touches private names, all of torch but one of LightningCLI's.

Every name below is private (a leading underscore) in the library that owns it and may change in any release. Code
elsewhere in ``lightning_modules`` calls the small functions of this module instead (``tests/test_structure.py``
fails when a private name appears anywhere else), and ``tests/lightning_modules/test_compat.py`` probes each one
against the installed versions. The recipes' own private names of Lightning live in ``recipes/compat.py``.

``PRIVATE_NAMES`` lists what each function relies on, for the probes and for the audit of an upgrade.
"""

from __future__ import annotations

import contextvars
import torch
from torch import nn

try:  # set by LightningCLI while it instantiates a module from a config (Lightning >= 2.3)
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters as _GIVEN_HYPERPARAMETERS
except ImportError:  # pragma: no cover - another Lightning without it: modules count as built in Python
    _GIVEN_HYPERPARAMETERS = None

# torch's common base of BatchNorm*d, InstanceNorm*d and SyncBatchNorm (``nn.modules.batchnorm._NormBase``)
BATCH_AND_INSTANCE_NORM: type[nn.Module] = nn.modules.batchnorm._NormBase

PRIVATE_NAMES: dict[str, str] = {
    "built_from_config": "lightning.pytorch.core.mixins.hparams_mixin._given_hyperparameters (a ContextVar)",
    "is_compiled_in_place": "torch.nn.Module._compiled_call_impl (set by Module.compile())",
    "optimizer_has_stepped": "torch.optim.Optimizer._opt_called (set by the step wrapper of an LR scheduler)",
    "BATCH_AND_INSTANCE_NORM": "torch.nn.modules.batchnorm._NormBase",
}


# --- lightning_modules ----------------------------------------------------------------------------------------
def built_from_config() -> bool:
    """Whether LightningCLI is instantiating a module from a parsed config right now (then the module's
    hyperparameters are the config: class paths and plain values that ``load_from_checkpoint`` can rebuild)."""
    return _GIVEN_HYPERPARAMETERS is not None and _GIVEN_HYPERPARAMETERS.get() is not None


def given_hyperparameters_var() -> contextvars.ContextVar | None:
    """Lightning's context variable behind ``built_from_config`` (``None`` where this Lightning has none)."""
    return _GIVEN_HYPERPARAMETERS


def is_compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module.compile()`` (in place, parameter names unchanged) has been called on ``module``."""
    return getattr(module, "_compiled_call_impl", None) is not None


def optimizer_has_stepped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` has run: it holds state, or the step wrapper that an LR scheduler installs has
    counted a call (plain SGD keeps no state)."""
    return bool(optimizer.state) or bool(getattr(optimizer, "_opt_called", False))


__all__ = [
    "BATCH_AND_INSTANCE_NORM", "built_from_config", "given_hyperparameters_var", "is_compiled_in_place",
    "optimizer_has_stepped", "PRIVATE_NAMES",
]
