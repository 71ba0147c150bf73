"""Optimization: the learning-rate schedules (``WarmupCosine``, ``OneCycle``, ``Plateau``, ``Constant``), the
optimizer's parameter groups (``param_groups``: weight decay or not, per learning-rate part) and the callback that
takes a ``Plateau`` step before the epoch's checkpoints (``PlateauStep``).

``lightning_modules.optim.WarmupCosine`` is the class path configs and stored runs name: these names stay here.
"""

from lightning_modules.optim.parameter_groups import apply_lr_factors, param_groups
from lightning_modules.optim.plateau_step import PlateauStep
from lightning_modules.optim.schedules import (
    Constant,
    OneCycle,
    Plateau,
    Schedule,
    WarmupCosine,
    total_optimizer_steps,
    warmup_cosine_factor,
)

__all__ = [
    "Constant",
    "OneCycle",
    "Plateau",
    "PlateauStep",
    "Schedule",
    "WarmupCosine",
    "apply_lr_factors",
    "param_groups",
    "total_optimizer_steps",
    "warmup_cosine_factor",
]
