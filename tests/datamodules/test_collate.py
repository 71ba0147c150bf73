"""pad_collate / PadCollate: shapes, masks, ignored label padding in the loss, and worker processes."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from datamodules.collate import PadCollate, pad_collate

LENGTHS = [3, 1, 5]


def _samples(sequence_labels: bool, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(1, 50, (n,), generator=gen)
        labels = torch.randint(0, 50, (n,), generator=gen).tolist() if sequence_labels else i % 2
        samples.append({"input_ids": ids if i % 2 else ids.tolist(), "labels": labels})
    return samples


def test_shapes_mask_and_padding_values():
    samples = _samples(sequence_labels=False)
    batch = pad_collate(samples, pad_id=7)
    assert batch["input_ids"].shape == (3, 5) and batch["input_ids"].dtype == torch.long
    assert batch["attention_mask"].dtype == torch.long
    assert batch["attention_mask"].sum(1).tolist() == LENGTHS
    for row, (sample, n) in enumerate(zip(samples, LENGTHS)):
        assert batch["input_ids"][row, :n].tolist() == torch.as_tensor(sample["input_ids"]).tolist()
        assert batch["input_ids"][row, n:].tolist() == [7] * (5 - n)
        assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (5 - n)
    assert batch["labels"].shape == (3,) and batch["labels"].dtype == torch.long
    assert batch["labels"].tolist() == [0, 1, 0]


def test_sequence_labels_are_padded_with_the_ignore_index():
    samples = _samples(sequence_labels=True)
    batch = pad_collate(samples)
    assert batch["labels"].shape == (3, 5) and batch["labels"].dtype == torch.long
    for row, (sample, n) in enumerate(zip(samples, LENGTHS)):
        assert batch["labels"][row, :n].tolist() == sample["labels"]
        assert batch["labels"][row, n:].tolist() == [-100] * (5 - n)
    assert (batch["labels"] == -100).sum() == 15 - sum(LENGTHS)
    assert pad_collate(samples, label_pad_id=-1)["labels"][1, 1:].tolist() == [-1] * 4


def test_extra_keys_are_padded_or_stacked_and_a_given_mask_is_kept():
    samples = [
        {"input_ids": [1, 2, 3], "token_type_ids": [1, 1, 1], "attention_mask": [1, 1, 0], "weight": 0.5},
        {"input_ids": [4], "token_type_ids": [1], "attention_mask": [1], "weight": 2.0},
    ]
    batch = pad_collate(samples)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "weight"}
    assert batch["token_type_ids"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert batch["weight"].tolist() == [0.5, 2.0]


def test_padded_positions_contribute_nothing_to_the_loss():
    samples = _samples(sequence_labels=True, seed=1)
    batch = pad_collate(samples)
    vocab = 50
    logits = torch.randn(3, 5, vocab, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    loss = F.cross_entropy(logits.transpose(1, 2), batch["labels"])
    # by hand: the mean over real positions only, from the unpadded samples
    per_token = [
        -torch.log_softmax(logits[row, t], dim=-1)[label]
        for row, sample in enumerate(samples)
        for t, label in enumerate(sample["labels"])
    ]
    assert len(per_token) == sum(LENGTHS)
    assert torch.allclose(loss, torch.stack(per_token).mean(), rtol=0, atol=1e-12)
    # changing the logits at padded positions leaves the loss unchanged
    padded = batch["attention_mask"] == 0
    changed = logits.clone()
    changed[padded] = torch.randn(int(padded.sum()), vocab, dtype=torch.float64) * 100
    assert not torch.equal(changed, logits)
    assert torch.equal(F.cross_entropy(changed.transpose(1, 2), batch["labels"]), loss)


def test_pad_collate_works_in_dataloader_workers():
    collate = PadCollate(pad_id=3, label_pad_id=-1)
    assert repr(pickle.loads(pickle.dumps(collate))) == "PadCollate(pad_id=3, label_pad_id=-1)"
    data = [{"input_ids": list(range(10, 10 + n)), "labels": n % 2} for n in (2, 4, 1, 3, 5, 2)]
    loader = DataLoader(data, batch_size=3, collate_fn=collate, num_workers=2)
    batches = list(loader)
    assert len(batches) == 2
    assert batches[0]["input_ids"].tolist() == [[10, 11, 3, 3], [10, 11, 12, 13], [10, 3, 3, 3]]
    assert batches[1]["attention_mask"].sum(1).tolist() == [3, 5, 2]
    assert batches[1]["input_ids"][2].tolist() == [10, 11, 3, 3, 3]
    assert torch.cat([b["labels"] for b in batches]).tolist() == [0, 0, 1, 1, 1, 0]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ([], "the batch is empty"),
        ([{"input_ids": [1, 2]}, {"input_ids": []}], "sample 1 has no tokens"),
        ([{"labels": 1}], "sample 0 has no 'input_ids'"),
        ([[1, 2, 3]], "sample 0 must be a dict"),
        ([{"input_ids": [[1, 2]]}], "must be one-dimensional, got shape \\(1, 2\\)"),
        ([{"input_ids": [0.5, 1.5]}], "must be token ids \\(ints\\)"),
        ([{"input_ids": [1, 2], "labels": 0}, {"input_ids": [1]}], "sample 1 has keys"),
        ([{"input_ids": [1, 2], "labels": 0}, {"input_ids": [1], "labels": [1]}], "scalar in sample 0"),
        ([{"input_ids": [1, 2], "labels": [1, 2, 3]}], "'labels' of sample 0 has shape \\(3,\\).*2 tokens"),
        ([{"input_ids": [1, 2], "labels": [0.5, 1.0]}], "must be ints"),
        ([{"input_ids": [1, 2], "text": "hi"}], "'text' of sample 0 is not a number"),
    ],
)
def test_bad_batches_raise_clear_errors(batch: list, message: str):
    with pytest.raises(ValueError, match=message):
        pad_collate(batch)
