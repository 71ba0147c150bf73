"""TextClassificationDataModule and the vocabulary: splits, train-only vocabulary, batches, buckets, errors, fit."""

from __future__ import annotations

import random

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import SequentialSampler

from datamodules.base import split_indices
from datamodules.samplers import LengthBucketBatchSampler, padding_fraction
from datamodules.text_classification import EpochRandomSampler, TextClassificationDataModule
from datamodules.tokenizers import Vocabulary, char_tokenize, word_tokenize
from lightning_modules import ClassificationModule
from tests.data_files import FILLER, keyword_rows, write_csv, write_jsonl



pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread


def label_ids(labels) -> torch.Tensor:
    names = sorted(set(labels))
    return torch.tensor([names.index(label) for label in labels])


# --- vocabulary -------------------------------------------------------------------------------------------------
def test_vocabulary_order_min_freq_max_size_and_round_trip():
    tokens = [["b", "a", "c", "a"], ["c", "a", "d", "b"], ["e"]]  # a:3, b:2, c:2, d:1, e:1
    vocab = Vocabulary.build(tokens)
    assert vocab.itos == ["<pad>", "<unk>", "a", "b", "c", "d", "e"]  # count desc, ties alphabetical
    assert vocab.pad_id == 0 and vocab.unk_id == 1 and len(vocab) == 7
    assert vocab.encode(["c", "zzz", "a"]) == [4, 1, 2]
    assert vocab.decode([4, 1, 2]) == ["c", "<unk>", "a"]
    assert Vocabulary.build(tokens, min_freq=2).itos == ["<pad>", "<unk>", "a", "b", "c"]
    assert Vocabulary.build(tokens, max_size=4).itos == ["<pad>", "<unk>", "a", "b"]
    assert Vocabulary.build(tokens, min_freq=3, max_size=10).itos == ["<pad>", "<unk>", "a"]
    state = vocab.state_dict()
    assert all(isinstance(t, str) for t in state["itos"])
    assert Vocabulary.from_state_dict(state) == vocab
    with pytest.raises(ValueError, match="min_freq must be >= 1"):
        Vocabulary.build(tokens, min_freq=0)
    with pytest.raises(ValueError, match="max_size=1 leaves no room"):
        Vocabulary.build(tokens, max_size=1)


def test_tokenizers():
    assert word_tokenize("  Great,\tFUN\nfilm!  ") == ["great,", "fun", "film!"]
    assert char_tokenize("Ab c") == ["A", "b", " ", "c"]


# --- splits and vocabulary from the train split -------------------------------------------------------------------
def test_splits_are_seeded_disjoint_complete_and_stratified(tmp_path):
    rng = random.Random(1)
    labels = ["a"] * 60 + ["b"] * 25 + ["c"] * 15
    rng.shuffle(labels)
    rows = [(" ".join(rng.choice(FILLER) for _ in range(rng.randint(2, 12))), label) for label in labels]
    path = write_csv(tmp_path / "data.csv", rows)
    kwargs = dict(val_fraction=0.2, test_fraction=0.1, seed=3)
    dm = TextClassificationDataModule(str(path), **kwargs)
    dm.setup("fit")
    assert dm.class_names == ["a", "b", "c"] and dm.num_classes == 3
    assert dm.split_sizes == {"train": 70, "val": 20, "test": 10}
    idx = split_indices(100, 0.2, 0.1, seed=3, labels=label_ids(labels))
    joined = torch.cat([idx["train"], idx["val"], idx["test"]]).tolist()
    assert sorted(joined) == list(range(100))  # disjoint and complete
    for split in ("train", "val", "test"):
        dataset = dm.datasets[split]
        for position, row in enumerate(idx[split].tolist()):
            sample = dataset[position]
            assert sample["input_ids"].tolist() == dm.encode(rows[row][0])
            assert dm.class_names[int(sample["labels"])] == rows[row][1]
        counts = torch.bincount(dataset.labels, minlength=3).tolist()
        fraction = {"train": 0.7, "val": 0.2, "test": 0.1}[split]
        for count, total in zip(counts, (60, 25, 15)):
            assert abs(count - total * fraction) <= 1, (split, counts)
    assert dm.class_counts == torch.bincount(dm.datasets["train"].labels).tolist()
    # the same seed gives the same split; another seed another one
    again = TextClassificationDataModule(str(path), **kwargs)
    again.setup("fit")
    assert torch.equal(again.datasets["val"].tokens, dm.datasets["val"].tokens)
    other = TextClassificationDataModule(str(path), val_fraction=0.2, test_fraction=0.1, seed=4)
    other.setup("fit")
    assert not torch.equal(other.datasets["val"].labels, dm.datasets["val"].labels) or not torch.equal(
        other.datasets["val"].tokens, dm.datasets["val"].tokens
    )


def test_vocabulary_comes_from_the_train_split_only(tmp_path):
    rows = keyword_rows(50, seed=2)
    idx = split_indices(50, 0.2, 0.0, seed=0, labels=label_ids([label for _, label in rows]))
    val_row, train_row = int(idx["val"][0]), int(idx["train"][0])
    rows[val_row] = ("zebra " + rows[val_row][0], rows[val_row][1])
    rows[train_row] = ("yak " + rows[train_row][0], rows[train_row][1])
    path = write_csv(tmp_path / "data.csv", rows)
    dm = TextClassificationDataModule(str(path), val_fraction=0.2, seed=0)
    dm.setup("fit")
    train_tokens = [word_tokenize(rows[i][0]) for i in idx["train"].tolist()]
    assert dm.vocabulary == Vocabulary.build(train_tokens)
    assert "yak" in dm.vocabulary and "zebra" not in dm.vocabulary
    assert dm.encode("zebra yak") == [1, dm.vocabulary.stoi["yak"]]
    val_sample = dm.datasets["val"][0]  # row val_row, which starts with "zebra"
    assert val_sample["input_ids"][0].item() == dm.unk_id == 1
    assert dm.datasets["train"][0]["input_ids"][0].item() == dm.vocabulary.stoi["yak"]


def test_min_freq_and_max_vocab_size_are_respected(tmp_path):
    rows = keyword_rows(120, seed=3)
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    full = TextClassificationDataModule(str(path))
    full.setup("fit")
    train_rows = split_indices(120, 0.2, 0.0, 0, label_ids([label for _, label in rows]))["train"].tolist()
    counts: dict[str, int] = {}
    for i in train_rows:
        for token in word_tokenize(rows[i][0]):
            counts[token] = counts.get(token, 0) + 1
    assert full.vocab_size == len(counts) + 2
    threshold = sorted(counts.values())[len(counts) // 2]
    frequent = TextClassificationDataModule(str(path), min_freq=threshold)
    frequent.setup("fit")
    assert set(frequent.vocabulary.itos[2:]) == {t for t, n in counts.items() if n >= threshold}
    capped = TextClassificationDataModule(str(path), max_vocab_size=7)
    capped.setup("fit")
    top = sorted(counts, key=lambda t: (-counts[t], t))[:5]
    assert capped.vocab_size == 7 and capped.vocabulary.itos == ["<pad>", "<unk>"] + top


# --- encodings and batches ------------------------------------------------------------------------------------------
def test_truncation_and_batch_shapes(tmp_path):
    rng = random.Random(4)
    rows = [(" ".join(rng.choice(FILLER) for _ in range(n)), "ab"[n % 2]) for n in range(1, 41)]
    path = write_csv(tmp_path / "data.csv", rows)
    dm = TextClassificationDataModule(str(path), max_length=7, batch_size=4, val_fraction=0.5)
    dm.setup("fit")
    idx = split_indices(40, 0.5, 0.0, 0, label_ids([label for _, label in rows]))
    expected = [min(len(rows[i][0].split()), 7) for i in idx["val"].tolist()]
    assert dm.datasets["val"].lengths.tolist() == expected
    assert dm.encode(rows[-1][0]) == dm.vocabulary.encode(word_tokenize(rows[-1][0]))[:7]
    seen = []
    for batch in dm.val_dataloader():  # no buckets: val batches follow the dataset order
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        b, t = batch["input_ids"].shape
        assert batch["attention_mask"].shape == (b, t) and batch["labels"].shape == (b,)
        assert batch["input_ids"].dtype == batch["attention_mask"].dtype == batch["labels"].dtype == torch.long
        lengths = batch["attention_mask"].sum(1)
        assert t == int(lengths.max()) <= 7
        assert (batch["input_ids"][batch["attention_mask"] == 0] == 0).all()  # padded with pad_id 0
        assert (batch["input_ids"][batch["attention_mask"] == 1] != 0).all()
        seen += lengths.tolist()
    assert seen == expected
    char = TextClassificationDataModule(str(path), tokenizer="char", max_length=5)
    char.setup("fit")
    assert char.tokenize("Ab c") == ["A", "b", " ", "c"]
    assert char.datasets["train"].lengths.max().item() == 5


@pytest.mark.parametrize("kind", ["str", "int"])
def test_csv_and_jsonl_give_identical_encodings(tmp_path, kind):
    rows = keyword_rows(60, seed=5)
    # quoting, commas, a newline and non-ASCII inside texts
    rows[3] = ('He said, "excellent" film,\nreally — très bien', rows[3][1])
    if kind == "int":
        mapping = {"pos": 10, "neg": 2}
        rows = [(text, mapping[label]) for text, label in rows]
    dms = [
        TextClassificationDataModule(str(write_csv(tmp_path / "d.csv", rows))),
        TextClassificationDataModule(str(write_jsonl(tmp_path / "d.jsonl", rows))),
    ]
    for dm in dms:
        dm.setup("fit")
    csv_dm, jsonl_dm = dms
    assert csv_dm.class_names == jsonl_dm.class_names == (["neg", "pos"] if kind == "str" else [2, 10])
    assert csv_dm.vocabulary == jsonl_dm.vocabulary
    for split in ("train", "val"):
        a, b = csv_dm.datasets[split], jsonl_dm.datasets[split]
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.offsets, b.offsets)
        assert torch.equal(a.labels, b.labels)


def padding_over_epoch(loader) -> float:
    padded = total = 0
    for batch in loader:
        mask = batch["attention_mask"]
        padded += int((mask == 0).sum())
        total += mask.numel()
    return padded / total


def test_length_buckets_reduce_padding(tmp_path):
    path = write_csv(tmp_path / "data.csv", keyword_rows(600, seed=6, min_words=1, max_words=100))
    plain = TextClassificationDataModule(str(path), batch_size=16, max_length=80)
    bucketed = TextClassificationDataModule(str(path), batch_size=16, max_length=80, bucket_by_length=True)
    plain_padding = padding_over_epoch(plain.train_dataloader())
    loader = bucketed.train_dataloader()
    bucket_padding = padding_over_epoch(loader)
    assert plain_padding > 0.3
    assert bucket_padding < 0.05 and bucket_padding < plain_padding / 5
    # the same number from the batch sampler's indices
    sampler = loader.batch_sampler
    assert isinstance(sampler, LengthBucketBatchSampler) and isinstance(sampler.sampler, EpochRandomSampler)
    lengths = bucketed.datasets["train"].lengths
    assert padding_fraction(list(sampler), lengths) == pytest.approx(bucket_padding)
    # every train sample once per epoch; another epoch gives other batches
    sampler.sampler.set_epoch(0)
    epoch0 = list(sampler)
    assert sorted(i for batch in epoch0 for i in batch) == list(range(480))
    sampler.sampler.set_epoch(1)
    assert list(sampler) != epoch0
    sampler.sampler.set_epoch(0)
    assert list(sampler) == epoch0
    # eval loaders bucket too, over all samples in a sequential sampler
    val_sampler = bucketed.val_dataloader().batch_sampler
    assert isinstance(val_sampler, LengthBucketBatchSampler) and isinstance(val_sampler.sampler, SequentialSampler)
    assert padding_over_epoch(bucketed.val_dataloader()) < padding_over_epoch(plain.val_dataloader())
    # predict batches keep the split order (outputs line up with samples)
    predicted = torch.cat([b["labels"] for b in bucketed.predict_dataloader()])
    assert torch.equal(predicted, bucketed.datasets["val"].labels)


def test_drop_last_applies_to_the_train_buckets_only(tmp_path):
    path = write_csv(tmp_path / "data.csv", keyword_rows(100, seed=7))
    dm = TextClassificationDataModule(str(path), batch_size=16, bucket_by_length=True, drop_last=True)
    train = [len(b["labels"]) for b in dm.train_dataloader()]
    val = [len(b["labels"]) for b in dm.val_dataloader()]
    assert train == [16] * 5  # 80 train samples
    assert sorted(val) == [4, 16]  # 20 val samples, nothing dropped


def test_two_workers_give_the_same_batches(tmp_path):
    path = write_csv(tmp_path / "data.csv", keyword_rows(80, seed=8))
    batches = {}
    for workers in (0, 2):
        dm = TextClassificationDataModule(str(path), batch_size=8, num_workers=workers, bucket_by_length=True)
        loader = dm.train_dataloader()
        batches[workers] = list(loader)
        del loader
    assert len(batches[0]) == len(batches[2]) == 8
    for a, b in zip(batches[0], batches[2]):
        assert all(torch.equal(a[key], b[key]) for key in a)


# --- checkpoint state -----------------------------------------------------------------------------------------------
def test_state_dict_round_trip_encodes_identically(tmp_path):
    path = write_jsonl(tmp_path / "data.jsonl", keyword_rows(60, seed=9))
    dm = TextClassificationDataModule(str(path), min_freq=2)
    assert dm.state_dict() == {} and dm.num_classes == 2  # num_classes reads the file when asked
    dm.setup("fit")
    torch.save(dm.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    # a module on other data (another seed, so another train split) restores the same vocabulary and classes
    other_path = write_jsonl(tmp_path / "other.jsonl", keyword_rows(60, seed=10))
    restored = TextClassificationDataModule(str(other_path), min_freq=2, seed=5)
    restored.setup("fit")
    assert restored.vocabulary != dm.vocabulary
    restored.load_state_dict(state)
    assert restored.vocabulary == dm.vocabulary and restored.class_names == dm.class_names
    text = "an excellent film about a zebra"
    assert restored.encode(text) == dm.encode(text)
    for i in range(len(restored.datasets["train"])):  # datasets were rebuilt with the restored vocabulary
        assert set(restored.datasets["train"][i]["input_ids"].tolist()) <= set(range(len(dm.vocabulary)))
    fresh = TextClassificationDataModule(str(other_path), min_freq=2, seed=5)
    fresh.load_state_dict(state)  # before setup, as when built for a checkpoint
    fresh.setup("fit")
    assert fresh.vocabulary == dm.vocabulary
    assert torch.equal(fresh.datasets["val"].tokens, restored.datasets["val"].tokens)
    with pytest.raises(ValueError, match="tokenizer='word'"):
        TextClassificationDataModule(str(path), tokenizer="char").load_state_dict(state)


# --- errors -------------------------------------------------------------------------------------------------------
def bad_json(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "good film", "label": 1}\n{"text": "bad", "label": 0}\n{"text": "oops", "label": \n')
    return path


def missing_text_field(tmp_path):
    return write_csv(tmp_path / "d.csv", [("good film", 1), ("bad film", 0)], fields=("body", "label"))


def missing_label_field(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"text": "good film", "label": 1}\n{"text": "bad film", "y": 0}\n')
    return path


def empty_text(tmp_path):
    return write_csv(tmp_path / "d.csv", [("good film", 1), ("bad film", 0), ("   ", 1)])


def one_class(tmp_path):
    return write_csv(tmp_path / "d.csv", [("good film", "pos"), ("great film", "pos")])


def mixed_labels(tmp_path):
    return write_jsonl(tmp_path / "d.jsonl", [("good film", "pos"), ("bad film", 0)])


def wrong_suffix(tmp_path):
    return write_csv(tmp_path / "d.txt", [("good film", 1), ("bad film", 0)])


def not_utf8(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes("text,label\ncaf\xe9 film,1\nbad film,0\n".encode("latin-1"))
    return path


@pytest.mark.parametrize(
    "make, error, match",
    [
        (bad_json, ValueError, r"bad\.jsonl' line 3: not valid JSON"),
        (missing_text_field, ValueError, r"the header has no field 'text'; its fields are \['body', 'label'\]"),
        (missing_label_field, ValueError, r"line 2: no field 'label'; its fields are \['text', 'y'\]"),
        (empty_text, ValueError, r"line 4: field 'text' is empty"),
        (one_class, ValueError, r"only one class \(label 'pos' in field 'label'\)"),
        (mixed_labels, ValueError, r"labels mix integers \(e\.g\. 0 on line 2\) and strings"),
        (wrong_suffix, ValueError, r"unknown file type '\.txt'"),
        (not_utf8, ValueError, r"is not UTF-8 text"),
    ],
)
def test_bad_files_fail_at_setup_with_a_named_cause_and_are_left_unchanged(tmp_path, make, error, match):
    path = make(tmp_path)
    before = path.read_bytes()
    dm = TextClassificationDataModule(str(path))
    with pytest.raises(error, match=match):
        dm.setup("fit")
    assert path.read_bytes() == before


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.csv' does not exist"):
        TextClassificationDataModule(str(tmp_path / "missing.csv")).setup("fit")
    with pytest.raises(ValueError, match="max_length must be >= 1, got 0"):
        TextClassificationDataModule("x.csv", max_length=0)
    with pytest.raises(ValueError, match="min_freq must be >= 1"):
        TextClassificationDataModule("x.csv", min_freq=0)
    with pytest.raises(ValueError, match="max_vocab_size must be >= 3"):
        TextClassificationDataModule("x.csv", max_vocab_size=2)
    with pytest.raises(ValueError, match="unknown tokenizer 'bpe'"):
        TextClassificationDataModule("x.csv", tokenizer="bpe")  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError, match="x.csv"):  # the size is read from the file when asked
        TextClassificationDataModule("x.csv").vocab_size


# --- training -----------------------------------------------------------------------------------------------------
class MeanEmbedding(nn.Module):
    """Mean of the token embeddings over the real tokens (attention_mask), then a linear classifier."""

    def __init__(self, vocab_size: int, num_classes: int, dim: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (self.embedding(input_ids) * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled)


def test_fit_on_keyword_classes_beats_the_majority_rate(tmp_path):
    path = write_csv(tmp_path / "data.csv", keyword_rows(400, seed=11, max_words=16))
    dm = TextClassificationDataModule(str(path), batch_size=32, bucket_by_length=True, seed=0)
    dm.setup("fit")
    L.seed_everything(0, verbose=False)
    module = ClassificationModule(
        MeanEmbedding(dm.vocab_size, dm.num_classes),
        num_classes=dm.num_classes,
        optimizer=lambda params: torch.optim.AdamW(params, lr=0.05),
    )
    trainer = L.Trainer(
        max_epochs=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, datamodule=dm)
    majority = max(dm.class_counts) / sum(dm.class_counts)
    assert majority == 0.5
    acc = trainer.callback_metrics["val/acc"].item()
    assert acc > 0.9, acc
    # Lightning set the epoch of the bucketed loader's sampler: each epoch has its own seeded order
    assert trainer.train_dataloader.batch_sampler.sampler.epoch == 4
    # Lightning stores the data module's state (vocabulary, class names) in the checkpoint
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    checkpoint = torch.load(tmp_path / "model.ckpt", weights_only=True)
    assert checkpoint["TextClassificationDataModule"]["vocabulary"]["itos"] == dm.vocabulary.itos
    assert checkpoint["TextClassificationDataModule"]["class_names"] == ["neg", "pos"]
