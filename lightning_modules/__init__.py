"""LightningModules for common tasks: inject any ``nn.Module`` network, get the right loop by default.

These modules never import ``recipes`` and work with a plain ``lightning.Trainer``.
"""

from lightning_modules.classification import ClassificationModule
from lightning_modules.language_model import LanguageModelModule
from lightning_modules.regression import RegressionModule
from lightning_modules.task import Task

__all__ = ["ClassificationModule", "LanguageModelModule", "RegressionModule", "Task"]
