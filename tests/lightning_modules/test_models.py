"""ConvNet, TransformerClassifier and GPT: shapes, masking, causality, weight tying, validation, Lightning training."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.models.convnet import ConvNet
from lightning_modules.models.gpt import GPT
from lightning_modules.models.transformer_classifier import TransformerClassifier

# no validation data in the Lightning smoke tests
pytestmark = [
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.usefixtures("one_thread"),  # tiny models: one torch thread
]

SMALL_CONV = dict(widths=[8, 16, 32])
SMALL_TC = dict(d_model=16, n_heads=2, n_layers=2, dim_feedforward=32)
SMALL_GPT = dict(block_size=16, d_model=16, n_heads=2, n_layers=2)


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def quiet_trainer(**kwargs):
    defaults = dict(
        max_steps=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return L.Trainer(**{**defaults, **kwargs})


def snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in module.named_parameters()}


# --- ConvNet --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(2, 1, 8, 8), (2, 3, 32, 32), (2, 3, 9, 13)])
def test_convnet_output_shape(shape):
    torch.manual_seed(0)
    net = ConvNet(in_channels=shape[1], num_classes=7, **SMALL_CONV)
    assert net.in_channels == shape[1] and net.num_classes == 7
    assert net(torch.randn(shape)).shape == (2, 7)
    assert n_params(net) > 0


def test_convnet_stages_downsample_by_two_after_the_first():
    net = ConvNet(in_channels=3, num_classes=10, widths=[8, 16, 32], blocks_per_stage=2)
    sizes = []
    hooks = [stage.register_forward_hook(lambda m, i, o: sizes.append(tuple(o.shape[1:]))) for stage in net.stages]
    net(torch.randn(2, 3, 32, 32))
    assert sizes == [(8, 32, 32), (16, 16, 16), (32, 8, 8)]
    sizes.clear()
    net(torch.randn(2, 3, 8, 8))
    assert sizes == [(8, 8, 8), (16, 4, 4), (32, 2, 2)]
    for hook in hooks:
        hook.remove()
    assert [len(stage) for stage in net.stages] == [2, 2, 2]
    # projection shortcut only where the shape changes: first block of stages 2 and 3
    projected = [not isinstance(block.shortcut, nn.Identity) for stage in net.stages for block in stage]
    assert projected == [False, False, True, False, True, False]
    assert all(m.bias is None for m in net.modules() if isinstance(m, nn.Conv2d))


def test_convnet_channels_last_matches_contiguous():
    torch.manual_seed(0)
    net = ConvNet(in_channels=3, num_classes=10, **SMALL_CONV).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = net(x)
        got = net(x.to(memory_format=torch.channels_last))
        net_cl = net.to(memory_format=torch.channels_last)
        got_cl_net = net_cl(x.to(memory_format=torch.channels_last))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_cl_net, expected, atol=1e-5, rtol=1e-5)


def test_convnet_rejects_wrong_input_channels():
    with pytest.raises(ValueError, match=r"\(2, 1, 8, 8\)"):
        ConvNet(in_channels=3, **SMALL_CONV)(torch.randn(2, 1, 8, 8))


# --- TransformerClassifier ------------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_transformer_classifier_output_shape(pooling):
    torch.manual_seed(0)
    net = TransformerClassifier(vocab_size=30, num_classes=4, pooling=pooling, **SMALL_TC)
    ids = torch.randint(1, 30, (3, 6))
    assert net(ids).shape == (3, 4)
    assert net(ids, torch.ones(3, 6, dtype=torch.long)).shape == (3, 4)
    assert n_params(net) > 0
    assert (net.cls_token is not None) == (pooling == "cls")
    # the padding row of the embedding is zero and gets no gradient; the CLS token gets one
    assert torch.count_nonzero(net.tok_emb.weight[0]) == 0
    padded = torch.tensor([[3, 4, 0], [5, 6, 7]])
    net(padded, (padded != 0).long()).sum().backward()
    assert torch.count_nonzero(net.tok_emb.weight.grad[0]) == 0
    if pooling == "cls":
        assert torch.count_nonzero(net.cls_token.grad) > 0


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_transformer_classifier_is_padding_invariant(pooling):
    torch.manual_seed(0)
    net = TransformerClassifier(vocab_size=30, num_classes=3, pooling=pooling, **SMALL_TC).eval()
    short = torch.tensor([[5, 6, 7, 8]])
    long = torch.tensor([[9, 10, 11, 12, 13, 14, 15, 16, 17]])
    ids = torch.zeros(2, 9, dtype=torch.long)
    ids[0, :4] = short
    ids[1] = long
    mask = (ids != 0).long()
    with torch.no_grad():
        alone = net(short)
        batched = net(ids, mask)
        assert not torch.allclose(batched[0], batched[1])
        torch.testing.assert_close(batched[:1], alone, atol=1e-5, rtol=0)
        torch.testing.assert_close(batched[1:], net(long), atol=1e-5, rtol=0)
        # token ids at padded positions do not matter
        garbage = ids.clone()
        garbage[0, 4:] = torch.tensor([1, 2, 3, 4, 29])
        torch.testing.assert_close(net(garbage, mask), batched, atol=1e-5, rtol=0)
        # a bool mask means the same as a 0/1 long mask
        torch.testing.assert_close(net(ids, mask.bool()), batched, atol=0, rtol=0)


def test_transformer_classifier_train_and_eval_agree_without_dropout():
    """No nested-tensor fast path: eval mode computes padded batches like train mode does."""
    torch.manual_seed(0)
    net = TransformerClassifier(vocab_size=30, num_classes=3, dropout=0.0, **SMALL_TC)
    ids = torch.tensor([[3, 4, 5, 0, 0], [6, 7, 8, 9, 10]])
    mask = (ids != 0).long()
    with torch.no_grad():
        train_out = net.train()(ids, mask)
        eval_out = net.eval()(ids, mask)
    torch.testing.assert_close(eval_out, train_out, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_transformer_classifier_sequence_of_only_padding_gives_finite_logits(pooling):
    net = TransformerClassifier(vocab_size=30, num_classes=3, pooling=pooling, **SMALL_TC).eval()
    ids = torch.tensor([[0, 0, 0], [4, 5, 0]])
    with torch.no_grad():
        out = net(ids, (ids != 0).long())
    assert torch.isfinite(out).all()


def test_transformer_classifier_rejects_too_long_and_mismatched_inputs():
    net = TransformerClassifier(vocab_size=30, num_classes=3, max_length=8, **SMALL_TC)
    net(torch.ones(1, 8, dtype=torch.long))  # exactly max_length is fine
    with pytest.raises(ValueError, match="sequence length 9 exceeds max_length=8"):
        net(torch.ones(1, 9, dtype=torch.long))
    cls_net = TransformerClassifier(vocab_size=30, num_classes=3, max_length=8, pooling="cls", **SMALL_TC)
    assert cls_net(torch.ones(1, 8, dtype=torch.long)).shape == (1, 3)  # CLS does not count towards max_length
    with pytest.raises(ValueError, match=r"attention_mask shape \(1, 4\)"):
        net(torch.ones(1, 5, dtype=torch.long), torch.ones(1, 4))


# --- GPT ------------------------------------------------------------------------------------------------------


def test_gpt_output_shape_and_attributes():
    net = GPT(vocab_size=11, **SMALL_GPT)
    assert net.vocab_size == 11 and net.block_size == 16
    assert net(torch.randint(0, 11, (3, 16))).shape == (3, 16, 11)
    assert net(torch.randint(0, 11, (2, 5)), attention_mask=torch.ones(2, 5)).shape == (2, 5, 11)
    assert n_params(net) > 0


def test_gpt_is_causal():
    torch.manual_seed(0)
    net = GPT(vocab_size=11, **SMALL_GPT).eval()
    ids = torch.randint(0, 11, (2, 12))
    t = 6
    changed = ids.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % 11
    with torch.no_grad():
        before, after = net(ids), net(changed)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], atol=1e-6, rtol=0)
    assert not torch.allclose(after[:, t + 1 :], before[:, t + 1 :])


def test_gpt_ignores_right_padding_at_real_positions():
    torch.manual_seed(0)
    net = GPT(vocab_size=11, **SMALL_GPT).eval()
    real = torch.tensor([[3, 4, 5, 6]])
    padded = torch.tensor([[3, 4, 5, 6, 0, 0, 0]])
    mask = (padded != 0).long()
    with torch.no_grad():
        torch.testing.assert_close(net(padded, mask)[:, :4], net(real), atol=1e-6, rtol=0)


def test_gpt_ties_head_to_token_embedding():
    torch.manual_seed(0)
    net = GPT(vocab_size=11, **SMALL_GPT)
    assert net.head.weight is net.tok_emb.weight
    untied = GPT(vocab_size=11, tie_weights=False, **SMALL_GPT)
    assert untied.head.weight is not untied.tok_emb.weight
    assert n_params(untied) - n_params(net) == 11 * 16
    before = net.tok_emb.weight.detach().clone()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.5)
    ids = torch.randint(0, 11, (4, 8))
    F.cross_entropy(net(ids).flatten(0, 1), ids.roll(-1, dims=1).flatten()).backward()
    optimizer.step()
    assert not torch.equal(net.tok_emb.weight, before)
    assert torch.equal(net.head.weight, net.tok_emb.weight)
    # rows of tokens never in the input still move: the head's gradient reaches the shared matrix
    unused = sorted(set(range(11)) - set(ids.unique().tolist()))
    if unused:
        assert not torch.equal(net.tok_emb.weight[unused], before[unused])


def test_gpt_init_scales_residual_projections():
    torch.manual_seed(0)
    net = GPT(vocab_size=64, block_size=16, d_model=128, n_heads=4, n_layers=8)
    assert net.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    proj_std = torch.cat([b.attn.proj.weight.flatten() for b in net.blocks]).std().item()
    assert proj_std == pytest.approx(0.02 / 4, rel=0.1)  # 1 / sqrt(2 * 8) = 1 / 4
    assert all(torch.count_nonzero(b.mlp[0].bias) == 0 for b in net.blocks)


def test_gpt_rejects_context_longer_than_block_size():
    net = GPT(vocab_size=11, **SMALL_GPT)
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size=16"):
        net(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.slow
def test_gpt_learns_a_repeating_sequence():
    torch.manual_seed(0)
    net = GPT(vocab_size=3, block_size=12, d_model=16, n_heads=2, n_layers=1, dropout=0.0)
    stream = torch.arange(13 + 2) % 3  # "abcabc..."
    windows = torch.stack([stream[i : i + 13] for i in range(3)])  # the three phases
    inputs, targets = windows[:, :-1], windows[:, 1:]
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2)
    for _ in range(100):
        loss = F.cross_entropy(net(inputs).reshape(-1, 3), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05


# --- argument validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs, match",
    [
        (ConvNet, {"in_channels": 0}, "in_channels must be >= 1, got 0"),
        (ConvNet, {"num_classes": 0}, "num_classes must be >= 1, got 0"),
        (ConvNet, {"widths": []}, r"at least one stage width, got \[\]"),
        (ConvNet, {"widths": [8, 0]}, r"every width must be >= 1, got \[8, 0\]"),
        (ConvNet, {"blocks_per_stage": 0}, "blocks_per_stage must be >= 1, got 0"),
        (ConvNet, {"dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
        (ConvNet, {"dropout": -0.1}, r"dropout must be in \[0, 1\), got -0.1"),
        (TransformerClassifier, {"vocab_size": 0, "num_classes": 2}, "vocab_size must be >= 1, got 0"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 0}, "num_classes must be >= 1, got 0"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "d_model": 30, "n_heads": 4}, "d_model=30"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "n_heads": 0}, "got 128, 0"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "n_layers": 0}, "n_layers must be >= 1, got 0"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "dim_feedforward": 0}, "dim_feedforward.*got 0"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "dropout": 1.5}, "dropout.*got 1.5"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "max_length": 0}, "max_length.*got 0"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "pooling": "max"}, "unknown pooling 'max'"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "pad_id": 10}, "pad_id.*got 10"),
        (TransformerClassifier, {"vocab_size": 10, "num_classes": 2, "pad_id": -1}, "pad_id.*got -1"),
        (GPT, {"vocab_size": 0}, "vocab_size must be >= 1, got 0"),
        (GPT, {"vocab_size": 10, "block_size": 0}, "block_size must be >= 1, got 0"),
        (GPT, {"vocab_size": 10, "d_model": 30, "n_heads": 4}, "d_model=30 is not divisible by n_heads=4"),
        (GPT, {"vocab_size": 10, "n_heads": 0}, "got 128, 0"),
        (GPT, {"vocab_size": 10, "n_layers": 0}, "n_layers must be >= 1, got 0"),
        (GPT, {"vocab_size": 10, "dropout": 1.0}, r"dropout must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(**kwargs)


# --- training in a ClassificationModule -----------------------------------------------------------------------


def assert_trains(module: ClassificationModule, loader: DataLoader) -> None:
    before = snapshot(module.model)
    trainer = quiet_trainer()
    trainer.fit(module, train_dataloaders=loader)
    assert trainer.global_step == 3
    after = snapshot(module.model)
    assert any(not torch.equal(before[name], after[name]) for name in before)
    assert all(torch.isfinite(p).all() for p in after.values())


def test_convnet_trains_in_classification_module():
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(12, 1, 8, 8), torch.randint(0, 3, (12,)))
    net = ConvNet(in_channels=1, num_classes=3, widths=[4, 8], dropout=0.1)
    assert_trains(ClassificationModule(net, num_classes=3), DataLoader(data, batch_size=4))


def pad_collate(items):
    """[(token ids, label), ...] -> right-padded {"input_ids", "attention_mask", "labels"} (pad id 0)."""
    length = max(len(ids) for ids, _ in items)
    input_ids = torch.zeros(len(items), length, dtype=torch.long)
    attention_mask = torch.zeros(len(items), length, dtype=torch.long)
    for row, (ids, _) in enumerate(items):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    labels = torch.tensor([label for _, label in items])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def test_transformer_classifier_trains_on_dict_batches():
    torch.manual_seed(0)
    items = [(torch.randint(1, 20, (n,)).tolist(), n % 2) for n in range(2, 14)]
    net = TransformerClassifier(vocab_size=20, num_classes=2, **SMALL_TC)
    loader = DataLoader(items, batch_size=4, shuffle=True, collate_fn=pad_collate)
    assert_trains(ClassificationModule(net, num_classes=2), loader)


class LastTokenLogits(nn.Module):
    """Next-token prediction after a prompt, framed as classification over the vocabulary."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.gpt = gpt

    def forward(self, input_ids, attention_mask=None):
        return self.gpt(input_ids, attention_mask)[:, -1]


def test_gpt_trains_in_classification_module_with_tied_weights():
    torch.manual_seed(0)
    ids = torch.randint(0, 7, (12, 6))
    items = [(row[:-1].tolist(), int(row[-1])) for row in ids]
    gpt = GPT(vocab_size=7, **SMALL_GPT)
    loader = DataLoader(items, batch_size=4, collate_fn=pad_collate)
    # the shared matrix must reach the optimizer once, not once per module that holds it
    assert_trains(ClassificationModule(LastTokenLogits(gpt), num_classes=7), loader)
    assert gpt.head.weight is gpt.tok_emb.weight
