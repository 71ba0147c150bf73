"""LanguageModelModule: loss and perplexity by hand, ignore_index, generate."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules import LanguageModelModule


class Bigram(nn.Module):
    """logits[t] depend only on token t: a lookup table."""

    def __init__(self, vocab_size: int, block_size: int | None = None):
        super().__init__()
        self.table = nn.Embedding(vocab_size, vocab_size)
        if block_size is not None:
            self.block_size = block_size

    def forward(self, input_ids, attention_mask=None):
        return self.table(input_ids)


def test_loss_and_perplexity_match_hand_computation():
    torch.manual_seed(0)
    module = LanguageModelModule(Bigram(5), vocab_size=5)
    x = torch.randint(0, 5, (2, 4))
    y = torch.randint(0, 5, (2, 4))
    out = module.forward_batch((x, y))
    logits = module.model(x)
    nll = -logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    assert out.loss.item() == pytest.approx(nll.mean().item(), rel=1e-6)
    module.val_metrics.update(out.outputs, out.targets)
    assert module.val_metrics.compute()["val/ppl"].item() == pytest.approx(math.exp(nll.mean().item()), rel=1e-5)


def test_ignored_positions_contribute_nothing():
    torch.manual_seed(1)
    module = LanguageModelModule(Bigram(6), vocab_size=6)
    x = torch.randint(0, 6, (1, 5))
    y = torch.tensor([[1, 2, 3, -100, -100]])
    batch = {"input_ids": x, "attention_mask": torch.tensor([[1, 1, 1, 0, 0]]), "labels": y}
    loss = module.forward_batch(batch).loss
    logits = module.model(x)
    expected = F.cross_entropy(logits[0, :3], y[0, :3])
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_generate_greedy_is_deterministic_and_respects_max_new_tokens():
    torch.manual_seed(0)
    net = Bigram(4, block_size=3)
    with torch.no_grad():  # make the next token after t be (t + 1) % 4
        net.table.weight.fill_(0.0)
        for t in range(4):
            net.table.weight[t, (t + 1) % 4] = 5.0
    module = LanguageModelModule(net, vocab_size=4)
    out = module.generate(torch.tensor([2]), max_new_tokens=6, top_k=1)
    assert out.tolist() == [2, 3, 0, 1, 2, 3, 0]
    assert torch.equal(module.generate(torch.tensor([[1], [0]]), 3, temperature=0.0), torch.tensor([[1, 2, 3, 0], [0, 1, 2, 3]]))
    assert module.generate(torch.tensor([1, 2]), max_new_tokens=0).tolist() == [1, 2]
    # sampling with a generator is reproducible and top_k restricts the choices
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = module.generate(torch.tensor([0]), 20, temperature=5.0, top_k=2, generator=g1)
    b = module.generate(torch.tensor([0]), 20, temperature=5.0, top_k=2, generator=g2)
    assert torch.equal(a, b) and len(a) == 21
    assert module.training is True  # restored after sampling


def test_shape_and_vocab_errors():
    module = LanguageModelModule(Bigram(5), vocab_size=6)
    with pytest.raises(ValueError, match=r"output shape \(batch, time, 6\)"):
        module.forward_batch((torch.zeros(1, 3).long(), torch.zeros(1, 3).long()))
    with pytest.raises(ValueError, match="vocab_size must be >= 2"):
        LanguageModelModule(Bigram(5), vocab_size=1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        LanguageModelModule(Bigram(5), vocab_size=5).generate(torch.tensor([1]), -1)
