"""Plain ``nn.Module`` networks. Any ``nn.Module`` works with the tasks; these are the ones the recipes use.

``HFSequenceClassifier``, ``HFCausalLM`` and ``HFImageClassifier`` wrap pretrained Hugging Face models (the extra
``loopwise[hf]``); ``transformers`` is imported when one is built, not here.
"""

from lightning_modules.models.convnet import ConvNet
from lightning_modules.models.gpt import GPT
from lightning_modules.models.hf import HFCausalLM, HFSequenceClassifier
from lightning_modules.models.hf_image import HFImageClassifier
from lightning_modules.models.mlp import MLP
from lightning_modules.models.transformer_classifier import TransformerClassifier

__all__ = ["GPT", "MLP", "ConvNet", "HFCausalLM", "HFImageClassifier", "HFSequenceClassifier", "TransformerClassifier"]
