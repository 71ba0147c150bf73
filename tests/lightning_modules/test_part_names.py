"""``part_names``: a network's own names for its parts (``backbone``, ``head``) in ``freeze``, ``unfreeze_at_epoch``
and ``lr_multipliers``, so one recipe fits networks whose module names differ by family."""

from __future__ import annotations

import pytest
from torch import nn

from lightning_modules import ClassificationModule


class Family(nn.Module):
    """A network laid out like a Hugging Face classifier: the backbone under a family-specific name."""

    def __init__(self, backbone_name: str) -> None:
        super().__init__()
        self.model = nn.Module()
        self.model.add_module(backbone_name, nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8)))
        self.model.classifier = nn.Linear(8, 3)
        self.part_names = {"backbone": f"model.{backbone_name}", "head": "model.classifier"}

    def forward(self, x):
        return self.model.classifier(getattr(self.model, self.part_names["backbone"].split(".")[1])(x))


@pytest.mark.parametrize("family", ["vit", "resnet", "convnext"])
def test_backbone_and_head_name_the_parts_of_every_family(family):
    task = ClassificationModule(
        Family(family), num_classes=3, freeze=["backbone"], unfreeze_at_epoch={"backbone": 1},
        lr_multipliers={"backbone.0": 0.1, "head": 10.0},
    )
    frozen = task.fine_tuning.freeze_schedule.scheduled_parameters()
    backbone = list(getattr(task.model.model, family).parameters())
    assert {id(p) for p in frozen} == {id(p) for p in backbone}
    factors = task.fine_tuning.lr_parts.factors(task.model)
    assert factors[f"model.{family}.0.weight"] == (0.1, f"model.{family}.0")
    assert factors["model.classifier.weight"] == (10.0, "model.classifier")
    assert factors[f"model.{family}.2.weight"] == (1.0, "")


def test_a_network_without_part_names_reads_the_patterns_as_written():
    with pytest.raises(ValueError, match="backbone"):
        ClassificationModule(nn.Sequential(nn.Linear(4, 3)), num_classes=3, freeze=["backbone"])
