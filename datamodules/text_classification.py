"""Text classification from a CSV or JSONL file: train-only vocabulary, padded batches, optional length buckets."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Sequence

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from datamodules.base import BaseDataModule
from datamodules.collate import PadCollate
from datamodules.samplers import EpochRandomSampler, LengthBucketBatchSampler
from datamodules.tokenizers import PAD, UNK, Vocabulary, get_tokenizer

CSV_SUFFIXES = (".csv",)
JSONL_SUFFIXES = (".jsonl", ".json-lines")
_INTEGER = re.compile(r"[+-]?\d+")

Label = int | str


def read_text_label_file(
    path: str | Path, text_field: str, label_field: str
) -> tuple[list[str], list[Label], list[int]]:
    """``(texts, labels, line_numbers)`` of every record of a CSV or JSONL file, read without modifying it.

    CSV (``.csv``): a header row names the fields; a label column whose values are all integers gives ``int``
    labels, otherwise the labels are the strings as written. JSONL (``.jsonl``, ``.json-lines``): one JSON object
    per line (blank lines are skipped); labels are JSON integers or strings. Texts must be non-blank strings.
    ``line_numbers`` holds the 1-based line on which each record starts. Errors name the file, the line, the
    field and the value.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in CSV_SUFFIXES + JSONL_SUFFIXES:
        raise ValueError(
            f"{str(path)!r}: unknown file type {path.suffix!r}; use a .csv file (with a header row) or a "
            ".jsonl / .json-lines file (one JSON object per line)"
        )
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} does not exist (or is not a file)")
    try:
        if suffix in CSV_SUFFIXES:
            records = _read_csv(path, text_field, label_field)
        else:
            records = _read_jsonl(path, text_field, label_field)
    except UnicodeDecodeError as err:
        raise ValueError(f"{str(path)!r} is not UTF-8 text (byte {err.start}: {err.reason})") from None
    if not records:
        raise ValueError(f"{str(path)!r} has no records")
    texts, labels, lines = [], [], []
    for line, text, label in records:
        if not isinstance(text, str):
            raise ValueError(
                f"{str(path)!r} line {line}: field {text_field!r} must be a string, got {text!r:.60} "
                f"({type(text).__name__})"
            )
        if not text.strip():
            raise ValueError(f"{str(path)!r} line {line}: field {text_field!r} is empty (or only whitespace)")
        texts.append(text)
        labels.append(label)
        lines.append(line)
    return texts, _check_labels(path, label_field, labels, lines), lines


def _read_csv(path: Path, text_field: str, label_field: str) -> list[tuple[int, Any, Any]]:
    records = []
    # utf-8-sig: a byte-order mark (as some spreadsheet exports write) is not part of the first field name
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        for field in (text_field, label_field):
            if field not in fields:
                raise ValueError(
                    f"{str(path)!r}: the header has no field {field!r}; its fields are {list(fields)}"
                )
        start = reader.line_num + 1
        for row in reader:
            for field in (text_field, label_field):
                if row.get(field) is None:
                    raise ValueError(f"{str(path)!r} line {start}: the row has no value for field {field!r}")
            records.append((start, row[text_field], row[label_field]))
            start = reader.line_num + 1
    labels = [label for _, _, label in records]
    if labels and all(_INTEGER.fullmatch(label.strip()) for label in labels):
        records = [(line, text, int(label)) for line, text, label in records]
    return records


def _read_jsonl(path: Path, text_field: str, label_field: str) -> list[tuple[int, Any, Any]]:
    records = []
    with path.open(encoding="utf-8-sig") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{str(path)!r} line {line_number}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{str(path)!r} line {line_number}: expected a JSON object, got {type(record).__name__}"
                )
            for field in (text_field, label_field):
                if field not in record:
                    raise ValueError(
                        f"{str(path)!r} line {line_number}: no field {field!r}; its fields are {list(record)}"
                    )
            records.append((line_number, record[text_field], record[label_field]))
    return records


def _check_labels(path: Path, label_field: str, labels: list[Any], lines: list[int]) -> list[Label]:
    """Labels must be all ints or all non-empty strings."""
    for label, line in zip(labels, lines):
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ValueError(
                f"{str(path)!r} line {line}: label field {label_field!r} must be an integer or a string, got "
                f"{label!r:.60} ({type(label).__name__})"
            )
        if isinstance(label, str) and not label.strip():
            raise ValueError(f"{str(path)!r} line {line}: label field {label_field!r} is empty")
    kinds = [isinstance(label, int) for label in labels]
    if any(kinds) and not all(kinds):
        first_int, first_str = kinds.index(True), kinds.index(False)
        raise ValueError(
            f"{str(path)!r}: labels mix integers (e.g. {labels[first_int]!r} on line {lines[first_int]}) and strings "
            f"(e.g. {labels[first_str]!r} on line {lines[first_str]}); use one kind"
        )
    return labels


class TokenSequenceDataset(Dataset):
    """Token-id sequences of varying length with one class label each, stored as one flat tensor.

    Sample ``i`` is ``{"input_ids": LongTensor (length_i,), "labels": LongTensor ()}``; collate with ``PadCollate``.

    Args:
        sequences: Token ids of each sample (each non-empty).
        labels: Class id of each sample, shape ``(n,)``.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], labels: Tensor) -> None:
        if len(sequences) != len(labels):
            raise ValueError(f"TokenSequenceDataset: {len(sequences)} sequences but {len(labels)} labels")
        self.lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
        self.offsets = torch.zeros(len(sequences) + 1, dtype=torch.long)
        torch.cumsum(self.lengths, 0, out=self.offsets[1:])
        flat = [token for sequence in sequences for token in sequence]
        self.tokens = torch.tensor(flat, dtype=torch.long)
        self.labels = labels.long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return {"input_ids": self.tokens[start:end], "labels": self.labels[index]}


class TextClassificationDataModule(BaseDataModule):
    """Classify texts read from a CSV or JSONL file; the file is never modified.

    The file type comes from the suffix: ``.csv`` (a header row names the fields) or ``.jsonl`` / ``.json-lines``
    (one JSON object per line). Labels, integers or strings, become class ids ``0..C-1`` in sorted order of the
    distinct labels of the whole file (``class_names[i]`` is the label of id ``i``); at least 2 classes.

    The split is stratified and seeded (before any preprocessing); the vocabulary is built from the train texts
    only: id 0 is ``<pad>``, id 1 ``<unk>`` (tokens unseen in train, or cut by ``min_freq``/``max_vocab_size``),
    then tokens by descending train count, ties alphabetically. Each text is tokenized, encoded and truncated to its
    first ``max_length`` tokens.

    Samples are ``{"input_ids": LongTensor (length,), "labels": LongTensor ()}``; batches are dicts with
    ``input_ids`` (B, T) padded with ``pad_id`` = 0, ``attention_mask`` (B, T) (1 on tokens, 0 on padding) and
    ``labels`` (B,), so the network is called as ``model(input_ids=..., attention_mask=...)``. With
    ``bucket_by_length`` the train, val and test batches group texts of similar length (less padding); predict
    batches keep the split order.

    ``class_names``, ``num_classes`` (``None`` before), ``vocab_size`` and ``vocabulary`` are set by ``setup``:
    the vocabulary depends on the train split. To size an embedding in a config before ``setup``, set
    ``max_vocab_size`` and use it (``vocab_size <= max_vocab_size``). The vocabulary and the class names are saved
    in checkpoints (``state_dict``), so a reloaded module encodes text and labels identically.

    The other arguments (``batch_size``, ``val_fraction``, ``test_fraction``, ``seed``, the loader options) are
    ``BaseDataModule``'s, passed on through ``**kwargs``; ``num_workers=0`` is usually fastest, since the texts are
    encoded in memory once.

    Args:
        path: CSV or JSONL file with one text and one label per record.
        text_field: Name of the text field (CSV column or JSON key).
        label_field: Name of the label field (CSV column or JSON key).
        tokenizer: "word": lower-cased, split on whitespace (punctuation stays attached to words); "char": every
            character, case kept.
        min_freq: Tokens seen fewer times in the train texts map to ``<unk>``.
        max_vocab_size: At most this many ids in all (``<pad>`` and ``<unk>`` included), the most frequent train
            tokens kept; null for no limit.
        max_length: Keep the first ``max_length`` tokens of each text.
        bucket_by_length: Batch texts of similar length together (less padding, faster); batch order is shuffled.
    """

    save_init_arguments = True
    #: Id of ``<pad>``: 0.
    pad_id: ClassVar[int] = 0
    #: Id of ``<unk>``: 1.
    unk_id: ClassVar[int] = 1

    def __init__(
        self,
        path: str,
        text_field: str = "text",
        label_field: str = "label",
        tokenizer: Literal["char", "word"] = "word",
        min_freq: int = 1,
        max_vocab_size: int | None = None,
        max_length: int = 256,
        bucket_by_length: bool = False,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        if max_length < 1:
            raise ValueError(f"{name}: max_length must be >= 1, got {max_length}")
        if min_freq < 1:
            raise ValueError(f"{name}: min_freq must be >= 1, got {min_freq}")
        if max_vocab_size is not None and max_vocab_size < 3:
            raise ValueError(
                f"{name}: max_vocab_size must be >= 3 (<pad>, <unk> and at least one token) or null, got "
                f"{max_vocab_size}"
            )
        try:
            self._tokenize = get_tokenizer(tokenizer)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        super().__init__(**kwargs)
        self.path = path
        self.text_field = text_field
        self.label_field = label_field
        self.tokenizer = tokenizer
        self.min_freq = min_freq
        self.max_vocab_size = max_vocab_size
        self.max_length = max_length
        self.bucket_by_length = bucket_by_length
        self.vocabulary: Vocabulary | None = None
        self._class_names: list[Label] | None = None
        self._keep_order = False

    # --- description ----------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """Number of classes (distinct labels of the file). Reads the file (``setup``) if needed."""
        return len(self.class_names)

    @property
    def class_names(self) -> list[Label]:
        """The label of each class id, sorted. Reads the file (``setup``) if needed."""
        if self._class_names is None:
            self.setup()
        assert self._class_names is not None
        return list(self._class_names)

    @property
    def vocab_size(self) -> int:
        """Number of token ids (``<pad>`` and ``<unk>`` included): the train split's vocabulary, built by ``setup``
        (run here if needed)."""
        if self.vocabulary is None:
            self.setup()
        assert self.vocabulary is not None
        return len(self.vocabulary)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` (before the vocabulary and truncation)."""
        return self._tokenize(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` exactly as in the datasets: encoded, unknown tokens as 1, truncated to max_length."""
        if self.vocabulary is None:
            raise RuntimeError(
                f"{type(self).__name__}: the vocabulary is built from the train split; call setup() first"
            )
        return self.vocabulary.encode(self._tokenize(text))[: self.max_length]

    # --- BaseDataModule hooks -------------------------------------------------------------------------------
    def load(self) -> tuple[list[str], Tensor]:
        """Texts and class ids of every record; sets ``class_names``."""
        name = type(self).__name__
        try:
            texts, labels, lines = read_text_label_file(self.path, self.text_field, self.label_field)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{name}: {err}") from None
        if self._class_names is None:
            class_names = sorted(set(labels))  # type: ignore[type-var]
            if len(class_names) < 2:
                raise ValueError(
                    f"{name}: {self.path!r} has only one class (label {class_names[0]!r} in field "
                    f"{self.label_field!r}); classification needs at least 2"
                )
            self._class_names = class_names
        index = {label: i for i, label in enumerate(self._class_names)}
        for label, line in zip(labels, lines):
            if label not in index:  # only with class names restored from a checkpoint
                raise ValueError(
                    f"{name}: {self.path!r} line {line}: label {label!r} is not one of the checkpoint's classes "
                    f"{self._class_names}"
                )
        return texts, torch.tensor([index[label] for label in labels], dtype=torch.long)

    def fit_preprocessing(self, train_inputs: list[str]) -> None:
        if self.vocabulary is None:  # a vocabulary restored from a checkpoint is kept
            self.vocabulary = Vocabulary.build(
                (self._tokenize(text) for text in train_inputs),
                min_freq=self.min_freq,
                max_size=self.max_vocab_size,
                specials=(PAD, UNK),
            )

    def make_dataset(self, split: str, inputs: list[str], targets: Tensor) -> Dataset:
        return TokenSequenceDataset([self.encode(text) for text in inputs], targets)

    def collate_fn(self, dataset: Dataset) -> Callable[[Any], Any] | None:
        return PadCollate(pad_id=self.pad_id)

    def batch_sampler(self, dataset: Dataset, train: bool) -> Sampler | None:
        """Length buckets when ``bucket_by_length`` (drop_last on train only); otherwise the base's batching."""
        if not self.bucket_by_length or self._keep_order:
            return None
        sampler = EpochRandomSampler(dataset, seed=self.seed) if train else SequentialSampler(dataset)
        if train and self.trainer is not None:
            sampler.set_epoch(self.trainer.current_epoch)  # type: ignore[union-attr]
        return LengthBucketBatchSampler(
            sampler,
            batch_size=self.batch_size,
            drop_last=self.drop_last and train,
            lengths=dataset.lengths,  # type: ignore[attr-defined]
            seed=self.seed,
        )

    def predict_dataloader(self) -> DataLoader:
        """Predict on the test split (or val without one), in split order: no length buckets, so outputs line up."""
        self._keep_order = True
        try:
            return super().predict_dataloader()
        finally:
            self._keep_order = False

    # --- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Vocabulary, class names and tokenizer (plain lists and strings), stored by Lightning in checkpoints."""
        if self.vocabulary is None or self._class_names is None:
            return {}
        return {
            "vocabulary": self.vocabulary.state_dict(),
            "class_names": list(self._class_names),
            "tokenizer": self.tokenizer,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a saved vocabulary and class names; datasets already built are rebuilt with them."""
        if not state_dict:
            return
        saved = state_dict.get("tokenizer", self.tokenizer)
        if saved != self.tokenizer:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint's vocabulary was built with tokenizer={saved!r}, but this "
                f"module has tokenizer={self.tokenizer!r}; set tokenizer: {saved}"
            )
        self.vocabulary = Vocabulary.from_state_dict(state_dict["vocabulary"])
        self._class_names = list(state_dict["class_names"])
        if self.datasets:
            self.datasets = {}
            self.class_counts = None
            self.setup()
