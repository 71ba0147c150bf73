"""LightningDataModules: seeded splits, train-only statistics, fast loaders. Usable with a plain Trainer."""

from datamodules.base import BaseDataModule
from datamodules.batch_augmentation import BatchAugmentation
from datamodules.char_lm import CharLMDataModule
from datamodules.digits import DigitsDataModule
from datamodules.image_folder import ImageFolderDataModule
from datamodules.spiral import SpiralDataModule
from datamodules.streaming_table import StreamingTableDataModule
from datamodules.synthetic import SyntheticDataModule
from datamodules.tabular import TabularDataModule
from datamodules.text_classification import TextClassificationDataModule

__all__ = [
    "BaseDataModule",
    "BatchAugmentation",
    "CharLMDataModule",
    "DigitsDataModule",
    "ImageFolderDataModule",
    "SpiralDataModule",
    "StreamingTableDataModule",
    "SyntheticDataModule",
    "TabularDataModule",
    "TextClassificationDataModule",
]
