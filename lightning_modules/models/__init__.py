"""Plain ``nn.Module`` networks. Any ``nn.Module`` works with the tasks; these are the ones the recipes use.

``HFSequenceClassifier``, ``HFCausalLM`` and ``HFImageClassifier`` wrap pretrained Hugging Face models (the extra
``loopwise[hf]``); ``transformers`` is imported when one is built, not here. ``TabM`` (with ``PeriodicEmbeddings`` of
the numeric features) is an efficient ensemble for tables: it returns k members' outputs, which the tasks train
and average.
"""

from lightning_modules.models.convnet import ConvNet
from lightning_modules.models.gpt import GPT
from lightning_modules.models.hf import HFCausalLM, HFSequenceClassifier
from lightning_modules.models.hf_image import HFImageClassifier
from lightning_modules.models.mlp import MLP
from lightning_modules.models.numeric_embeddings import PeriodicEmbeddings
from lightning_modules.models.tabm import TabM
from lightning_modules.models.transformer_classifier import TransformerClassifier

__all__ = [
    "GPT",
    "MLP",
    "ConvNet",
    "HFCausalLM",
    "HFImageClassifier",
    "HFSequenceClassifier",
    "PeriodicEmbeddings",
    "TabM",
    "TransformerClassifier",
]
