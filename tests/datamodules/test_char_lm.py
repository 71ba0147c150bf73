"""CharLMDataModule: contiguous split, windows inside each part, train-only vocabulary, batches, errors, fit."""

from __future__ import annotations

import math
import random
from collections import Counter

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from datamodules.char_lm import CharLMDataModule, WindowDataset

ALPHABET = "abcdefghijklmnop \n"


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread


def markov_text(n: int, seed: int = 0, alphabet: str = ALPHABET) -> str:
    """``n`` characters of a Markov chain in which every character has 3 possible successors."""
    rng = random.Random(seed)
    successors = {c: rng.sample(alphabet, 3) for c in alphabet}
    char, out = alphabet[0], []
    for _ in range(n):
        out.append(char)
        char = rng.choice(successors[char])
    return "".join(out)


def write(tmp_path, text: str, name: str = "text.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("stride", [None, 5])
def test_contiguous_split_and_no_window_crosses_the_boundary(tmp_path, stride):
    text = markov_text(1000)
    dm = CharLMDataModule(str(write(tmp_path, text)), block_size=16, val_fraction=0.1, stride=stride)
    dm.setup("fit")
    boundary = 900
    assert dm.boundary == boundary and dm.block_size == 16 and dm.stride == (stride or 16)
    train, val = dm.datasets["train"], dm.datasets["val"]
    assert torch.equal(train.data, torch.tensor(dm.encode(text[:boundary])))
    assert torch.equal(val.data, torch.tensor(dm.encode(text[boundary:])))
    step = stride or 16
    for part, dataset, offset in (("train", train, 0), ("val", val, boundary)):
        for i in range(len(dataset)):
            x, y = dataset[i]
            first_input = offset + i * step  # text index of x[0]
            last_target = first_input + 16  # text index of y[-1]
            if part == "train":
                assert last_target < boundary
            else:
                assert first_input >= boundary and last_target < len(text)
            # y is x shifted by one: y[t] is the character after x[t]
            assert dm.decode(x) == text[first_input : first_input + 16]
            assert dm.decode(y) == text[first_input + 1 : last_target + 1]
            assert torch.equal(x[1:], y[:-1])


@pytest.mark.parametrize(
    "n, block_size, stride, val_fraction",
    [(1000, 16, None, 0.1), (1000, 16, 4, 0.25), (1000, 8, 1, 0.5), (400, 33, 50, 0.3)],
)
def test_window_counts_match_the_formula(tmp_path, n, block_size, stride, val_fraction):
    dm = CharLMDataModule(
        str(write(tmp_path, markov_text(n))), block_size=block_size, stride=stride, val_fraction=val_fraction,
        batch_size=7,
    )
    dm.setup("fit")
    step = stride or block_size
    n_val = round(n * val_fraction)
    for split, length in (("train", n - n_val), ("val", n_val)):
        # a window starts at s with s + block_size <= length - 1
        expected = len(range(0, length - block_size, step))
        assert dm.split_sizes[split] == expected
        assert expected == (length - block_size - 1) // step + 1
    assert len(dm.train_dataloader()) == math.ceil(dm.split_sizes["train"] / 7)


def test_vocabulary_comes_from_the_train_part_only(tmp_path):
    text = markov_text(900) + markov_text(100, seed=1, alphabet="abcQZ")  # Q and Z occur only in the val part
    dm = CharLMDataModule(str(write(tmp_path, text)), block_size=8, val_fraction=0.1)
    dm.setup("fit")
    counts = Counter(text[:900])
    assert dm.itos == ["<unk>"] + sorted(counts, key=lambda c: (-counts[c], c))
    assert dm.vocab_size == len(counts) + 1 and dm.unk_id == 0
    assert "Q" not in dm.stoi and "Z" not in dm.stoi
    assert dm.encode("aQZ") == [dm.stoi["a"], 0, 0]
    val = dm.datasets["val"].data
    unknown = torch.tensor([c in "QZ" for c in text[900:]])
    assert unknown.any() and (val[unknown] == 0).all() and (val[~unknown] != 0).all()
    assert (dm.datasets["train"].data != 0).all()


def test_text_is_read_exactly_and_the_file_is_left_unchanged(tmp_path):
    raw = ("line one\r\nline two, café\r\n" * 40).encode("utf-8")
    path = tmp_path / "crlf.txt"
    path.write_bytes(raw)
    dm = CharLMDataModule(str(path), block_size=8)
    dm.setup("fit")
    assert "\r" in dm.stoi and "é" in dm.stoi
    assert dm.decode(torch.cat([dm.datasets["train"].data, dm.datasets["val"].data])) == raw.decode("utf-8")
    assert path.read_bytes() == raw


def test_batches_are_fetched_whole(tmp_path, monkeypatch):
    dm = CharLMDataModule(str(write(tmp_path, markov_text(3000))), block_size=16, batch_size=32)
    dm.setup("fit")
    calls = []
    original = WindowDataset.__getitems__

    def counting(self, indices):
        calls.append(len(indices))
        return original(self, indices)

    def per_sample(self, index):
        raise AssertionError("the loader fetched one window at a time")

    monkeypatch.setattr(WindowDataset, "__getitems__", counting)
    monkeypatch.setattr(WindowDataset, "__getitem__", per_sample)
    batches = list(dm.train_dataloader())
    n_train = dm.split_sizes["train"]  # (2700 - 17) // 16 + 1 = 168
    assert n_train == 168 and calls == [32] * 5 + [8]
    assert [tuple(x.shape) for x, _ in batches] == [(32, 16)] * 5 + [(8, 16)]
    for x, y in batches:
        assert x.dtype == y.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])
    # seeded shuffling: every window once, in another order than the dataset's
    starts = torch.cat([x[:, 0] for x, _ in batches])
    assert not torch.equal(starts, dm.datasets["train"].data[: 16 * n_train : 16])
    assert sorted(starts.tolist()) == sorted(dm.datasets["train"].data[: 16 * n_train : 16].tolist())
    val = list(dm.val_dataloader())
    assert sum(len(x) for x, _ in val) == dm.split_sizes["val"]


def test_two_workers_give_the_same_batches(tmp_path):
    path = write(tmp_path, markov_text(3000))
    batches = {}
    for workers in (0, 2):
        dm = CharLMDataModule(str(path), block_size=16, batch_size=32, num_workers=workers)
        batches[workers] = list(dm.train_dataloader())
    assert len(batches[0]) == len(batches[2]) == 6
    for (x0, y0), (x2, y2) in zip(batches[0], batches[2]):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def test_drop_last_and_no_test_split(tmp_path):
    dm = CharLMDataModule(str(write(tmp_path, markov_text(3000))), block_size=16, batch_size=32, drop_last=True)
    assert [len(x) for x, _ in dm.train_dataloader()] == [32] * 5
    assert sum(len(x) for x, _ in dm.val_dataloader()) == dm.split_sizes["val"] == 18
    assert sum(len(x) for x, _ in dm.predict_dataloader()) == 18
    with pytest.raises(ValueError, match="no test split; the text is split into train and val only"):
        dm.test_dataloader()
    with pytest.raises(ValueError, match="the train part has 168 windows, fewer than batch_size=500"):
        CharLMDataModule(str(tmp_path / "text.txt"), block_size=16, batch_size=500, drop_last=True).setup("fit")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block_size": 0}, "block_size must be >= 1, got 0"),
        ({"val_fraction": 0.0}, r"val_fraction must be in \(0, 1\), got 0.0"),
        ({"val_fraction": 1.0}, r"val_fraction must be in \(0, 1\), got 1.0"),
        ({"stride": 0}, "stride must be >= 1"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CharLMDataModule("text.txt", **kwargs)


def test_bad_files_fail_at_setup_and_are_left_unchanged(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.txt' does not exist"):
        CharLMDataModule(str(tmp_path / "missing.txt")).setup("fit")
    short = write(tmp_path, "x" * 100, "short.txt")
    with pytest.raises(
        ValueError,
        match=r"has 100 characters; with val_fraction=0.1 the train part has 90 and the val part 10, but each needs "
        r"at least block_size \+ 1 = 17",
    ):
        CharLMDataModule(str(short), block_size=16).setup("fit")
    assert short.read_text() == "x" * 100
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café ".encode("latin-1") * 100)
    with pytest.raises(ValueError, match=r"is not UTF-8 text: line 1, byte 3 is 0xe9 .*save the file as UTF-8"):
        CharLMDataModule(str(latin), block_size=8).setup("fit")
    assert latin.read_bytes() == "café ".encode("latin-1") * 100
    with pytest.raises(ValueError, match="at least block_size"):  # the size is read from the file when asked
        CharLMDataModule(str(short)).vocab_size


def test_state_dict_round_trip_encodes_identically(tmp_path):
    dm = CharLMDataModule(str(write(tmp_path, markov_text(2000), "a.txt")), block_size=16)
    assert dm.state_dict() == {}
    dm.setup("fit")
    torch.save(dm.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    other_text = markov_text(2000, seed=3, alphabet="abcdefXYZ ")  # other frequencies, unseen characters
    restored = CharLMDataModule(str(write(tmp_path, other_text, "b.txt")), block_size=16)
    restored.setup("fit")
    assert restored.itos != dm.itos
    restored.load_state_dict(state)
    assert restored.itos == dm.itos and restored.vocab_size == dm.vocab_size
    sample = "abc XYZ\nponm"
    assert restored.encode(sample) == dm.encode(sample)
    # the windows were rebuilt with the restored vocabulary
    assert torch.equal(restored.datasets["train"].data, torch.tensor(dm.encode(other_text[:1800])))
    fresh = CharLMDataModule(str(tmp_path / "b.txt"), block_size=16)
    fresh.load_state_dict(state)  # before setup: the restored vocabulary is kept
    fresh.setup("fit")
    assert fresh.itos == dm.itos and torch.equal(fresh.datasets["val"].data, restored.datasets["val"].data)


class Bigram(L.LightningModule):
    """Embedding -> Linear: the next character from the current one only."""

    def __init__(self, vocab_size: int, dim: int = 32) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, dim)
        self.head = nn.Linear(dim, vocab_size)

    def loss(self, batch):
        x, y = batch
        logits = self.head(self.embedding(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def training_step(self, batch, batch_idx):
        return self.loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.loss(batch), batch_size=len(batch[0]))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.03)


def test_bigram_fit_beats_the_unigram_entropy(tmp_path):
    text = markov_text(20000, seed=4)
    counts = Counter(text)
    unigram_entropy = -sum(n / len(text) * math.log(n / len(text)) for n in counts.values())  # nats
    dm = CharLMDataModule(str(write(tmp_path, text)), block_size=32, batch_size=64, val_fraction=0.1)
    dm.setup("fit")
    L.seed_everything(0, verbose=False)
    module = Bigram(dm.vocab_size)
    trainer = L.Trainer(
        max_epochs=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(module, datamodule=dm)
    val_loss = trainer.callback_metrics["val/loss"].item()
    # a character has 3 possible successors: the conditional entropy is about log 3 = 1.10 nats
    assert unigram_entropy > 2.7
    assert val_loss < unigram_entropy - 1.0, (val_loss, unigram_entropy)
    trainer.save_checkpoint(tmp_path / "lm.ckpt")
    checkpoint = torch.load(tmp_path / "lm.ckpt", weights_only=True)
    assert checkpoint["CharLMDataModule"]["vocabulary"]["itos"] == dm.itos
