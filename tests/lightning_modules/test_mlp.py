import pytest
import torch
from torch import nn

from lightning_modules.models import MLP


def test_shapes_and_layer_structure():
    net = MLP(2, 3, hidden_sizes=[16, 8], activation="gelu", dropout=0.1, norm="layer")
    kinds = [type(m) for m in net.net]
    assert kinds == [nn.Linear, nn.LayerNorm, nn.GELU, nn.Dropout, nn.Linear, nn.LayerNorm, nn.GELU, nn.Dropout, nn.Linear]
    assert net(torch.randn(5, 2)).shape == (5, 3)
    # image-like inputs are flattened
    assert MLP(64, 10, [32])(torch.randn(4, 1, 8, 8)).shape == (4, 10)
    n_params = sum(p.numel() for p in MLP(2, 3, [128, 128]).parameters())
    assert n_params == (2 * 128 + 128) + (128 * 128 + 128) + (128 * 3 + 3)


def test_no_hidden_layers_is_a_linear_model():
    net = MLP(4, 2, hidden_sizes=[])
    assert len(net.net) == 1 and isinstance(net.net[0], nn.Linear)


def test_batch_norm_and_dropout_follow_train_and_eval_mode():
    torch.manual_seed(0)
    net = MLP(3, 2, [8], dropout=0.5, norm="batch")
    x = torch.randn(16, 3)
    net.eval()
    assert torch.equal(net(x), net(x))
    net.train()
    assert not torch.equal(net(x), net(x))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"in_features": 0, "out_features": 2}, "in_features"),
        ({"in_features": 2, "out_features": 2, "hidden_sizes": [0]}, "hidden size"),
        ({"in_features": 2, "out_features": 2, "dropout": 1.0}, "dropout"),
        ({"in_features": 2, "out_features": 2, "activation": "swish"}, "unknown activation"),
        ({"in_features": 2, "out_features": 2, "norm": "group"}, "unknown norm"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MLP(**kwargs)
