"""init_from with a head of another shape: the suggested ``init_from.exclude`` names the real key prefix of the keys
that differ (``['net.6']`` for an MLP's output layer), and following it loads the rest (issue 31, point 8)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from lightning_modules import ClassificationModule
from lightning_modules.fine_tuning.initial_weights import InitialWeights
from lightning_modules.models import MLP

pytestmark = pytest.mark.usefixtures("one_thread")


def suggested_exclude(message: str) -> list[str]:
    found = re.search(r"init_from\.exclude: (\[[^\]]*\])", message)
    assert found, message
    return eval(found.group(1))  # noqa: S307 - the list of strings the message suggests


@pytest.fixture
def three_class_weights(tmp_path):
    """The weights of a 3-class MLP with three hidden layers (its output layer is ``net.6``)."""
    torch.manual_seed(0)
    source = MLP(2, 3, [16, 16, 16])
    torch.save(source.state_dict(), tmp_path / "net.pt")
    return source, str(tmp_path / "net.pt")


def test_a_head_of_another_shape_suggests_excluding_its_real_prefix(three_class_weights):
    source, path = three_class_weights
    five = ClassificationModule(MLP(2, 5, [16, 16, 16]), num_classes=5, init_from=path)
    with pytest.raises(ValueError) as err:
        five.load_initial_weights()
    message = str(err.value)
    assert "net.6.weight file (3, 16) vs network (5, 16)" in message
    assert suggested_exclude(message) == ["net.6"] and "'head'" not in message
    # following the suggestion loads every other tensor, strictly
    fixed = ClassificationModule(MLP(2, 5, [16, 16, 16]), num_classes=5,
                                 init_from=InitialWeights(path, exclude=suggested_exclude(message)))
    report = fixed.load_initial_weights()
    assert report.complete and report.excluded == ["net.6.weight", "net.6.bias"] and len(report.loaded) == 6
    assert torch.equal(fixed.model.net[4].weight, source.net[4].weight)


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = MLP(2, 3, [16, 16, 16])
        self.classifier = nn.Linear(3, 5)

    def forward(self, x):
        return self.classifier(self.backbone(x))


def test_missing_keys_suggest_their_module_and_several_parts_are_each_named(three_class_weights):
    _, path = three_class_weights
    into_wrapped = ClassificationModule(Wrapped(), num_classes=5, init_from=InitialWeights(path, add_prefix="backbone."))
    with pytest.raises(ValueError) as err:
        into_wrapped.load_initial_weights()
    assert suggested_exclude(str(err.value)) == ["classifier"]  # the keys the network has and the file lacks
    wider = ClassificationModule(MLP(2, 3, [16, 8, 16]), num_classes=3, init_from=path)
    with pytest.raises(ValueError) as err:
        wider.load_initial_weights()
    assert suggested_exclude(str(err.value)) == ["net.2", "net.4"]  # the layers on either side of the narrower one
