"""Fine-tuning: initial weights read weights-only (``InitialWeights``, ``WeightsReport``), frozen parts and their
schedule (``FreezeSchedule``), learning rates per part (``LearningRateParts``), gathered in a task's ``FineTuning``."""

from lightning_modules.fine_tuning.freezing import FreezeSchedule
from lightning_modules.fine_tuning.initial_weights import (
    InitialWeights,
    InitialWeightsSpec,
    WeightsReport,
    load_initial_weights,
    read_weights,
)
from lightning_modules.fine_tuning.learning_rates import LearningRateParts
from lightning_modules.fine_tuning.settings import TRACKED_REFERENCE_PREFIXES, FineTuning, LoadInitialWeights

__all__ = [
    "TRACKED_REFERENCE_PREFIXES",
    "FineTuning",
    "FreezeSchedule",
    "InitialWeights",
    "InitialWeightsSpec",
    "LearningRateParts",
    "LoadInitialWeights",
    "WeightsReport",
    "load_initial_weights",
    "read_weights",
]
