"""Next-character prediction on one UTF-8 text file: a contiguous train/val split and windows sliced in memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.base import BaseDataModule
from datamodules.csv_reading import not_utf8_message
from datamodules.hf_tokenizer import HFTokenizer
from datamodules.tensor_dataset import keep_batch
from datamodules.tokenizers import UNK, Vocabulary


def count_windows(length: int, block_size: int, stride: int) -> int:
    """Windows of ``block_size + 1`` characters, starting every ``stride``, that fit in ``length`` characters."""
    span = block_size + 1
    return 0 if length < span else (length - span) // stride + 1


class WindowDataset(Dataset):
    """Language-model windows over one encoded text, sliced on demand.

    Window ``i`` covers characters ``[i * stride, i * stride + block_size]`` (``block_size + 1`` of them); its sample
    is ``(x, y) = (window[:-1], window[1:])``, so ``y[t]`` is the character after ``x[t]``. ``__getitems__`` slices
    a whole batch with one gather, giving ``(x, y)`` of shape ``(batch, block_size)``: use it with
    ``collate_fn=keep_batch``.

    Args:
        data: The encoded text, a 1-D LongTensor.
        block_size: Characters of context per sample.
        stride: Characters between the starts of consecutive windows.
    """

    def __init__(self, data: Tensor, block_size: int, stride: int) -> None:
        if data.ndim != 1:
            raise ValueError(f"WindowDataset: data must be 1-D, got shape {tuple(data.shape)}")
        if block_size < 1 or stride < 1:
            raise ValueError(f"WindowDataset: block_size and stride must be >= 1, got {block_size}, {stride}")
        self.data = data
        self.block_size = block_size
        self.stride = stride
        self.offsets = torch.arange(block_size + 1)

    def __len__(self) -> int:
        return count_windows(len(self.data), self.block_size, self.stride)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"WindowDataset: window {index} out of range for {len(self)} windows")
        start = (index % len(self)) * self.stride
        chunk = self.data[start : start + self.block_size + 1]
        return chunk[:-1], chunk[1:]

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, Tensor]:
        starts = torch.as_tensor(indices, dtype=torch.long) * self.stride
        chunk = self.data[starts[:, None] + self.offsets]
        return chunk[:, :-1], chunk[:, 1:]


class PromptDataset(Dataset):
    """Encoded prompts of varying length for generation: sample ``i`` is ``{"prompt_ids": LongTensor (length_i,),
    "index": i}``; ``collate_prompts`` keeps a batch's prompts as a list (they are not padded: padding would change
    what a causal model continues).

    Args:
        prompts: The token ids of each prompt (each non-empty).
    """

    def __init__(self, prompts: Sequence[Tensor]) -> None:
        self.prompts = [p.long() for p in prompts]

    def __len__(self) -> int:
        return len(self.prompts)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {"prompt_ids": self.prompts[index], "index": index}


def collate_prompts(samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A batch of prompts: ``{"prompt_ids": [LongTensor, ...], "index": LongTensor (batch,)}``."""
    return {
        "prompt_ids": [sample["prompt_ids"] for sample in samples],
        "index": torch.tensor([int(sample["index"]) for sample in samples], dtype=torch.long),
    }


def read_prompts(path: str | Path) -> tuple[list[str], list[int]]:
    """``(prompts, line_numbers)``: every non-empty line of a UTF-8 text file (without its line ending), and its
    line number from 0. Errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompt file {str(path)!r} does not exist (or is not a file)")
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            text = handle.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"prompt file {not_utf8_message(path, err)}") from None
    prompts, lines = [], []
    for number, line in enumerate(text.split("\n")):
        line = line[:-1] if line.endswith("\r") else line
        if line:
            prompts.append(line)
            lines.append(number)
    if not prompts:
        raise ValueError(f"prompt file {str(path)!r} has no prompts (one prompt per non-empty line)")
    return prompts, lines


class CharLMDataModule(BaseDataModule):
    """Next-character prediction on a UTF-8 text file (e.g. Tiny Shakespeare).

    The text is read exactly as stored (no newline translation; the file is never modified) and split
    contiguously: train is the first characters, val the last ``round(len(text) * val_fraction)``. Windows are cut
    inside each part, so no sample crosses the boundary. There is no test split (``test_dataloader`` raises);
    ``predict_dataloader`` yields the val windows, or the prompts of ``prompt_path`` to continue.

    Samples are ``(x, y)`` LongTensors of length ``block_size`` with ``y[t]`` the character after ``x[t]``; the
    loaders give ``(x, y)`` of shape ``(batch, block_size)``, sliced a whole batch at a time. Train and val windows
    start every ``stride`` characters; with the default ``stride = block_size`` the windows do not overlap and each
    character of a part after its first is a target exactly once per epoch. A smaller ``stride`` gives more,
    overlapping, windows.

    The vocabulary comes from the train part only: id 0 is ``<unk>`` (characters that occur only in the val part),
    then the train characters by descending count, ties by code point. ``vocab_size``, ``vocabulary``,
    ``encode`` and ``decode`` are available after ``setup``; the vocabulary is saved in checkpoints
    (``state_dict``), so a reloaded module encodes text identically.

    With ``tokenizer: <a local directory or hub name of a Hugging Face tokenizer>`` (the extra ``loopwise[hf]``),
    tokens are the pretrained model's: the split is still by characters, each part is encoded on its own as one
    stream without special tokens (a window is a piece of running text, and prompts are encoded the same way),
    ``block_size``, ``stride`` and the windows count tokens, ``vocab_size`` is the tokenizer's ``len``, and the
    checkpoint records the tokenizer's name and size.

    The other arguments (``batch_size``: windows per batch, ``seed``: of the train shuffling, the loader options) are
    ``BaseDataModule``'s, passed on through ``**kwargs``; ``num_workers=0`` is fastest, since batches are cheap slices
    of one tensor. There is no ``test_fraction`` or ``stratify``: the split is contiguous.

    Args:
        path: UTF-8 text file to model.
        block_size: Characters (tokens, with a Hugging Face tokenizer) of context per sample (the length of ``x`` and
            ``y``).
        val_fraction: Fraction of the characters, taken from the end of the text, held out for validation; in (0, 1).
        stride: Characters between the starts of consecutive windows, in both parts; default ``block_size``
            (non-overlapping windows).
        prompt_path: A UTF-8 text file of prompts, one per non-empty line, for ``predict``: each is encoded with
            the vocabulary the model was trained with (restored from the checkpoint; characters it does not know
            become ``<unk>``) and continued by ``LanguageModelModule`` (its ``max_new_tokens``, ``temperature``,
            ``top_k``, ``sample_seed``). A prediction's ``row`` is the prompt's line number from 0. Default:
            predict the most likely next character at every position of the val windows.
        tokenizer: "char": every character is a token, with a vocabulary from the train part; or a Hugging Face
            tokenizer: a local directory written by ``save_pretrained`` or a hub name such as ``gpt2`` (needs
            ``loopwise[hf]``).
    """

    save_init_arguments = True
    fixed_arguments = ("test_fraction", "stratify")

    def __init__(
        self,
        path: str,
        block_size: int = 128,
        *,
        val_fraction: float = 0.1,
        stride: int | None = None,
        prompt_path: str | None = None,
        tokenizer: str = "char",
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        if tokenizer == "word":
            raise ValueError(
                f"{name}: tokenizer 'word' would lose the text's spacing and punctuation; use 'char' or a Hugging Face "
                "tokenizer (a local directory or hub name)"
            )
        if block_size < 1:
            raise ValueError(f"{name}: block_size must be >= 1, got {block_size}")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"{name}: val_fraction must be in (0, 1), got {val_fraction}")
        if stride is not None and stride < 1:
            raise ValueError(f"{name}: stride must be >= 1 (or null for block_size), got {stride}")
        super().__init__(val_fraction=val_fraction, test_fraction=0.0, stratify=False, **kwargs)
        self.path = path
        self.block_size = block_size
        self.stride = stride if stride is not None else block_size
        self.prompt_path = prompt_path
        self.tokenizer = tokenizer
        self.hf_tokenizer = None if tokenizer == "char" else HFTokenizer(tokenizer, name)
        self.prompts: list[str] = []  # the prompts of the last predict_dataloader, in order
        self.vocabulary: Vocabulary | None = None
        self.boundary: int | None = None

    # --- description ----------------------------------------------------------------------------------------
    def _require_vocabulary(self) -> Vocabulary:
        if self.hf_tokenizer is not None:
            raise AttributeError(
                f"{type(self).__name__}: the character vocabulary (itos, stoi) exists with tokenizer 'char' only; this "
                f"module's tokenizer is {self.tokenizer!r} (the Hugging Face tokenizer is .hf_tokenizer.tokenizer)"
            )
        if self.vocabulary is None:  # built from the train text by setup
            self.setup()
        assert self.vocabulary is not None
        return self.vocabulary

    @property
    def vocab_size(self) -> int:
        """Number of ids (train characters plus ``<unk>``; a Hugging Face tokenizer's ``len``). Reads the file
        (``setup``) if needed."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.vocab_size
        return len(self._require_vocabulary())

    @property
    def unk_id(self) -> int | None:
        """Id of ``<unk>`` (0): characters that do not occur in the train part (a Hugging Face tokenizer's)."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.unk_id
        return self._require_vocabulary().unk_id

    @property
    def itos(self) -> list[str]:
        """The character of each id (id 0 is ``<unk>``); available after ``setup``."""
        return self._require_vocabulary().itos

    @property
    def stoi(self) -> dict[str, int]:
        """The id of each known character; available after ``setup``."""
        return self._require_vocabulary().stoi

    def encode(self, text: str) -> list[int]:
        """Ids of the characters of ``text`` (unknown characters give ``unk_id``); a Hugging Face tokenizer's ids,
        without special tokens."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.encode(text, special_tokens=False)
        return self._require_vocabulary().encode(text)

    def decode(self, ids: Sequence[int] | Tensor) -> str:
        """The text of ``ids``; ``<unk>`` appears as the five characters ``<unk>``."""
        values = ids.tolist() if isinstance(ids, Tensor) else ids
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.decode(values)
        return "".join(self._require_vocabulary().decode(values))

    # --- loading --------------------------------------------------------------------------------------------
    def read_text(self) -> str:
        """The whole file as text, exactly as stored, with clear errors for a missing or non-UTF-8 file."""
        name = type(self).__name__
        path = Path(self.path)
        if not path.is_file():
            raise FileNotFoundError(f"{name}: text file {str(path)!r} does not exist (or is not a file)")
        try:
            with path.open(encoding="utf-8", newline="") as handle:
                return handle.read()
        except UnicodeDecodeError as err:
            raise ValueError(f"{name}: {not_utf8_message(path, err)}") from None

    def encode_tensor(self, text: str) -> Tensor:
        """``encode(text)`` as a 1-D LongTensor, vectorized over code points (fast for large files)."""
        if self.hf_tokenizer is not None:
            return torch.tensor(self.encode(text), dtype=torch.long)
        vocab = self._require_vocabulary()
        codes = torch.from_numpy(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64))
        known = [(ord(token), i) for i, token in enumerate(vocab.itos) if len(token) == 1]
        out = torch.full_like(codes, vocab.unk_id)
        if not known or len(codes) == 0:
            return out
        keys, ids = torch.tensor(known, dtype=torch.long).T
        keys, order = keys.sort()
        ids = ids[order]
        pos = torch.searchsorted(keys, codes).clamp_(max=len(keys) - 1)
        found = keys[pos] == codes
        return torch.where(found, ids[pos], out)

    def setup(self, stage: str | None = None) -> None:
        """Read the text, split it contiguously, build the vocabulary from the train part and cut the windows."""
        if self.datasets or (stage == "predict" and self.predicts_new_data()):
            return  # prompts are read by predict_dataloader, with the checkpoint's vocabulary
        name = type(self).__name__
        text = self.read_text()
        boundary = len(text) - int(round(len(text) * self.val_fraction))
        if self.vocabulary is None and self.hf_tokenizer is None:
            self.vocabulary = Vocabulary.build([text[:boundary]], specials=(UNK,))
        # a tokenizer's tokens may span the boundary: each part is encoded on its own (the same as slicing for chars)
        train, val = self.encode_tensor(text[:boundary]), self.encode_tensor(text[boundary:])
        span = self.block_size + 1
        if len(train) < span or len(val) < span:
            unit = "characters" if self.hf_tokenizer is None else f"tokens of {self.tokenizer!r}"
            raise ValueError(
                f"{name}: {str(self.path)!r} has {len(train) + len(val)} {unit}; with val_fraction="
                f"{self.val_fraction} the train part has {len(train)} and the val part {len(val)}, but each needs at "
                f"least block_size + 1 = {span} for one window: use a longer text, a smaller block_size or another "
                "val_fraction"
            )
        self.boundary = boundary
        self.datasets = {
            "train": WindowDataset(train, self.block_size, self.stride),
            "val": WindowDataset(val, self.block_size, self.stride),
        }
        n_train = len(self.datasets["train"])  # type: ignore[arg-type]
        if self.drop_last and n_train < self.batch_size:
            raise ValueError(
                f"{name}: the train part has {n_train} windows, fewer than batch_size={self.batch_size} with "
                "drop_last=True, so every batch would be dropped"
            )

    def collate_fn(self, dataset: Dataset) -> Callable[[Any], Any] | None:
        """Batches arrive already stacked from ``WindowDataset.__getitems__``; prompts stay a list."""
        return collate_prompts if isinstance(dataset, PromptDataset) else keep_batch

    def test_dataloader(self) -> DataLoader:
        raise ValueError(
            f"{type(self).__name__}: there is no test split; the text is split into train and val only "
            "(evaluate with validate)"
        )

    def predicts_new_data(self) -> bool:
        return self.prompt_path is not None

    def new_data(self) -> tuple[Dataset, list[Any]] | None:
        """The prompts of ``prompt_path`` encoded with the vocabulary (unknown characters as ``<unk>``), in file
        order, with their line numbers from 0; sets ``prompts``."""
        if self.prompt_path is None:
            return None
        try:
            prompts, lines = read_prompts(self.prompt_path)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{type(self).__name__}: {err}") from None
        self.prompts = prompts
        return PromptDataset([self.encode_tensor(prompt) for prompt in prompts]), lines

    def predict_dataloader(self) -> DataLoader:
        """The prompts of ``prompt_path`` in file order; without it the val windows, in order."""
        new = self.new_data()
        if new is not None:
            dataset, self.prediction_ids = new
            return self.make_loader(dataset, train=False)
        self.prompts, self.prediction_ids = [], []
        return self.make_loader(self.split("val"), train=False)

    # --- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The vocabulary (plain lists), stored by Lightning in checkpoints, empty before ``setup``; a Hugging Face
        tokenizer's name and size."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.state_dict()
        return {} if self.vocabulary is None else {"vocabulary": self.vocabulary.state_dict(), "tokenizer": "char"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a saved vocabulary (a tokenizer other than the checkpoint's is refused); windows already built are
        re-encoded with it."""
        if not state_dict:
            return
        saved = state_dict.get("tokenizer", "char")  # checkpoints from before the tokenizer option: characters
        if saved != self.tokenizer:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint was trained with tokenizer={saved!r}, but this module has "
                f"tokenizer={self.tokenizer!r}; set tokenizer: {saved}"
            )
        if self.hf_tokenizer is not None:
            self.hf_tokenizer.check_state(state_dict, type(self).__name__)
            return
        if "vocabulary" not in state_dict:
            return
        self.vocabulary = Vocabulary.from_state_dict(state_dict["vocabulary"])
        if self.datasets:
            self.datasets = {}
            self.setup()
