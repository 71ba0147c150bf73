"""PeriodicEmbeddings (PLR, lite) and TabM (BatchEnsemble MLP returning k members' outputs), issue 55 item 3."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from lightning_modules.models.mlp import MLP
from lightning_modules.models.numeric_embeddings import PeriodicEmbeddings
from lightning_modules.models.tabm import BatchEnsembleLinear, LinearEnsemble, TabM

pytestmark = pytest.mark.usefixtures("one_thread")


# --- PeriodicEmbeddings ----------------------------------------------------------------------------------------
def test_periodic_embeddings_shapes_and_defaults():
    emb = PeriodicEmbeddings(5)
    assert (emb.d_embedding, emb.n_frequencies, emb.frequency_scale, emb.lite) == (16, 48, 0.01, True)
    assert emb.frequencies.shape == (5, 48)
    assert emb(torch.randn(7, 5)).shape == (7, 5, 16)
    assert PeriodicEmbeddings(5, 8, 4, lite=False)(torch.randn(7, 5)).shape == (7, 5, 8)


def test_periodic_frequencies_are_a_truncated_normal_of_the_scale():
    torch.manual_seed(0)
    c = PeriodicEmbeddings(50, n_frequencies=200, frequency_scale=0.5).frequencies.detach()
    assert c.abs().max() <= 1.5 + 1e-6  # truncated at 3 sigma
    assert 0.45 < float(c.std()) < 0.52  # a 3-sigma truncation shrinks the std by 1.3%
    assert abs(float(c.mean())) < 0.02


def expected_plr(x: list[list[float]], c: list[list[float]], weight, bias) -> torch.Tensor:
    """ReLU(sum_m W[f][o][m] * [cos(2 pi c_fj x), sin(2 pi c_fj x)]_m + b[f][o]) by hand, for every row and feature
    (``weight(f)``, ``bias(f)``: feature f's Linear)."""
    rows = []
    for row in x:
        feats = []
        for f, value in enumerate(row):
            periodic = [math.cos(2 * math.pi * cj * value) for cj in c[f]] + [
                math.sin(2 * math.pi * cj * value) for cj in c[f]
            ]
            w, b = weight(f), bias(f)
            linear = [sum(w[o][m] * periodic[m] for m in range(len(periodic))) + b[o] for o in range(len(b))]
            feats.append([max(0.0, value) for value in linear])
        rows.append(feats)
    return torch.tensor(rows)


def test_periodic_embeddings_lite_known_value():
    emb = PeriodicEmbeddings(2, d_embedding=3, n_frequencies=2, lite=True)
    c = [[0.1, -0.3], [0.25, 0.05]]
    w = [[0.5, -1.0, 0.25, 2.0], [-0.5, 0.75, 1.0, -0.2], [0.3, 0.3, -0.3, 0.1]]  # (d_embedding, 2k): nn.Linear's
    b = [0.1, -0.2, 0.05]
    with torch.no_grad():
        emb.frequencies.copy_(torch.tensor(c))
        emb.linear.weight.copy_(torch.tensor(w))
        emb.linear.bias.copy_(torch.tensor(b))
    x = [[1.0, -2.0], [0.5, 3.0], [-1.5, 0.0]]
    out = emb(torch.tensor(x))
    expected = expected_plr(x, c, lambda f: w, lambda f: b)
    assert out.shape == (3, 2, 3)
    torch.testing.assert_close(out, expected)
    assert (out == 0).any() and (out > 0).any()  # the ReLU cut something


def test_periodic_embeddings_per_feature_linear_known_value():
    emb = PeriodicEmbeddings(2, d_embedding=2, n_frequencies=1, lite=False)
    c = [[0.2], [-0.4]]
    w = torch.tensor([[[1.0, -0.5], [0.5, 2.0]], [[-1.0, 0.3], [0.7, 0.2]]])  # (n_features, 2k, d)
    b = torch.tensor([[0.1, 0.0], [-0.1, 0.4]])
    with torch.no_grad():
        emb.frequencies.copy_(torch.tensor(c))
        emb.weight.copy_(w)
        emb.bias.copy_(b)
    x = [[1.0, -2.0], [0.5, 3.0]]
    expected = expected_plr(x, c, lambda f: w[f].T.tolist(), lambda f: b[f].tolist())
    torch.testing.assert_close(emb(torch.tensor(x)), expected)


def test_periodic_embeddings_wrong_width_is_one_line():
    with pytest.raises(ValueError, match=r"expects input of shape \(batch, 3\), got \(4, 2\)"):
        PeriodicEmbeddings(3)(torch.randn(4, 2))


# --- TabM --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["tabm", "mini"])
@pytest.mark.parametrize("embedding", [None, "periodic"])
def test_tabm_returns_k_members_outputs(arch, embedding):
    model = TabM(12, 3, numeric_features=4, k=5, hidden_sizes=[16, 8], embedding=embedding, arch=arch)
    out = model(torch.randn(6, 12))
    assert out.shape == (6, 5, 3)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_tabm_defaults():
    model = TabM(10, 2)
    assert model.k == 32 and [block[0].out_features for block in model.backbone] == [512, 512, 512]
    assert isinstance(model.backbone[0][2], nn.Dropout) and model.backbone[0][2].p == 0.1
    assert model.embeddings is None


def test_tabm_initialisation_random_signs_first_then_ones():
    torch.manual_seed(0)
    model = TabM(6, 2, k=8, hidden_sizes=[10, 10, 10])
    first, *rest = [block[0] for block in model.backbone]
    assert set(first.r.detach().unique().tolist()) == {-1.0, 1.0}
    assert all(torch.equal(layer.r, torch.ones_like(layer.r)) for layer in rest)
    assert all(torch.equal(layer.s, torch.ones_like(layer.s)) for layer in [first, *rest])
    assert all(torch.equal(layer.bias, layer.bias[:1].expand_as(layer.bias)) for layer in [first, *rest])
    model.eval()
    out = model(torch.randn(4, 6))
    assert not torch.allclose(out[:, 0], out[:, 1])  # the members differ from the start


def test_tabm_members_follow_the_batch_ensemble_formula():
    k = 3
    model = TabM(2, 1, k=k, hidden_sizes=[2], dropout=0.0)
    layer, head = model.backbone[0][0], model.head
    W = torch.tensor([[1.0, -2.0], [0.5, 0.25]])
    r = torch.tensor([[1.0, -1.0], [-1.0, 1.0], [2.0, 0.5]])
    s = torch.tensor([[1.0, 1.0], [0.5, -1.0], [1.5, 2.0]])
    b = torch.tensor([[0.0, 0.1], [-0.2, 0.3], [0.4, -0.5]])
    hw = torch.tensor([[[1.0], [2.0]], [[-1.0], [0.5]], [[0.25], [-3.0]]])  # (k, hidden, out)
    hb = torch.tensor([[0.1], [0.2], [-0.3]])
    with torch.no_grad():
        layer.weight.copy_(W), layer.r.copy_(r), layer.s.copy_(s), layer.bias.copy_(b)
        head.weight.copy_(hw), head.bias.copy_(hb)
    x = torch.tensor([[1.0, 2.0], [-0.5, 3.0]])
    out = model(x)
    assert out.shape == (2, k, 1)
    for i in range(k):
        hidden = torch.relu(((x * r[i]) @ W.T) * s[i] + b[i])
        torch.testing.assert_close(out[:, i], hidden @ hw[i] + hb[i])


def test_tabm_with_one_member_is_an_mlp():
    torch.manual_seed(0)
    mlp = MLP(7, 3, hidden_sizes=[9, 5])
    tabm = TabM(7, 3, k=1, hidden_sizes=[9, 5], dropout=0.0)
    linears = [m for m in mlp.net if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for block, linear in zip(tabm.backbone, linears):
            layer = block[0]
            layer.weight.copy_(linear.weight), layer.bias.copy_(linear.bias[None])
            layer.r.fill_(1.0)  # the first layer's random sign
        tabm.head.weight.copy_(linears[-1].weight.T[None]), tabm.head.bias.copy_(linears[-1].bias[None])
    x = torch.randn(4, 7)
    torch.testing.assert_close(tabm(x)[:, 0], mlp(x))


def test_tabm_parameters_are_the_shared_mlp_plus_k_times_the_widths():
    k, d_in, hidden, out = 4, 6, [10, 8], 3
    count = sum(p.numel() for p in TabM(d_in, out, k=k, hidden_sizes=hidden).parameters())
    shared = d_in * 10 + 10 * 8  # the shared weights W
    per_member = (d_in + 10 + 10) + (10 + 8 + 8) + (8 * out + out)  # r, s, b per layer; each member's head
    assert count == shared + k * per_member
    mini = sum(p.numel() for p in TabM(d_in, out, k=k, hidden_sizes=hidden, arch="mini").parameters())
    assert mini == (d_in * 10 + 10 + 10 * 8 + 8) + k * (d_in + 8 * out + out)  # a plain MLP, r and the heads


def test_tabm_periodic_embeddings_only_the_leading_numeric_columns():
    torch.manual_seed(0)
    model = TabM(5, 2, numeric_features=2, k=2, hidden_sizes=[4], embedding="periodic", d_embedding=3, dropout=0.0)
    assert model.backbone[0][0].in_features == 2 * 3 + 3
    x = torch.randn(3, 5)
    seen = {}
    model.backbone.register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
    model(x)
    expected = torch.cat([model.embeddings(x[:, :2]).flatten(1), x[:, 2:]], dim=1)
    assert seen["x"].shape == (3, 2, 9)
    for member in range(2):  # every member gets the row: embedded numeric columns, then the rest as it is
        torch.testing.assert_close(seen["x"][:, member], expected)


def test_tabm_mini_has_one_adapter_and_a_plain_mlp():
    model = TabM(4, 2, k=3, hidden_sizes=[5], arch="mini")
    assert model.adapter.shape == (3, 4) and set(model.adapter.detach().unique().tolist()) <= {-1.0, 1.0}
    assert type(model.backbone[0][0]) is nn.Linear and isinstance(model.head, LinearEnsemble)
    assert not any(isinstance(m, BatchEnsembleLinear) for m in model.modules())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"embedding": "periodic"}, r"embedding='periodic' needs numeric_features >= 1"),
        ({"numeric_features": 11}, r"numeric_features must be in \[0, in_features=10\]"),
        ({"k": 0}, r"k \(the number of ensemble members\) must be >= 1"),
        ({"arch": "big"}, r"arch must be 'tabm' or 'mini'"),
    ],
)
def test_tabm_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TabM(10, 2, **kwargs)


def test_tabm_wrong_input_width_is_one_line():
    with pytest.raises(ValueError, match=r"TabM\(in_features=4\) expects input of shape \(batch, 4\), got \(2, 5\)"):
        TabM(4, 2, k=2, hidden_sizes=[3])(torch.randn(2, 5))


def test_the_first_adapter_is_drawn_per_feature_normal_with_embeddings_as_the_reference_does():
    torch.manual_seed(0)
    model = TabM(5, 2, numeric_features=2, k=4, hidden_sizes=[8], embedding="periodic", d_embedding=3)
    r = model.backbone[0][0].r.detach()
    assert r.shape == (4, 2 * 3 + 3)
    # one value per embedded feature, shared by its 3 embedding positions; the 3 other columns one each
    assert torch.equal(r[:, 0:3], r[:, :1].expand(-1, 3)) and torch.equal(r[:, 3:6], r[:, 3:4].expand(-1, 3))
    assert not set(r.unique().tolist()) <= {-1.0, 1.0}  # N(0, 1), not signs
    mini = TabM(5, 2, numeric_features=2, k=4, hidden_sizes=[8], embedding="periodic", d_embedding=3, arch="mini")
    assert torch.equal(mini.adapter[:, 0:3], mini.adapter[:, :1].expand(-1, 3).detach())
