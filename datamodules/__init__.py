"""LightningDataModules: seeded splits, train-only statistics, fast loaders. Usable with a plain Trainer."""

from datamodules.base import BaseDataModule
from datamodules.spiral import SpiralDataModule

__all__ = ["BaseDataModule", "SpiralDataModule"]
