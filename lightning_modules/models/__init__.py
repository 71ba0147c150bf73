"""Plain ``nn.Module`` networks. Any ``nn.Module`` works with the tasks; these are the ones the recipes use."""

from lightning_modules.models.mlp import MLP

__all__ = ["MLP"]
