"""Text classification from a CSV or JSONL file: train-only vocabulary, padded batches, optional length buckets."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler, SequentialSampler

from datamodules.base import BaseDataModule
from datamodules.collate import PadCollate
from datamodules.hf_tokenizer import HFTokenizer, is_builtin_tokenizer
from datamodules.samplers import EpochRandomSampler, LengthBucketBatchSampler
from datamodules.text_files import (  # noqa: F401  (read_text_label_file: importable from here as before)
    CSV_SUFFIXES,
    JSONL_SUFFIXES,
    Label,
    check_text_file_type,
    read_text_label_file,
)
from datamodules.tokenizers import PAD, UNK, Vocabulary, get_tokenizer


class TokenSequenceDataset(Dataset):
    """Token-id sequences of varying length with one class label each, stored as one flat tensor.

    Sample ``i`` is ``{"input_ids": LongTensor (length_i,), "labels": LongTensor ()}``; collate with ``PadCollate``.

    Args:
        sequences: Token ids of each sample (each non-empty).
        labels: Class id of each sample, shape ``(n,)``; ``None`` for texts without labels (new data to predict):
            the samples then have no ``labels``.
    """

    def __init__(self, sequences: Sequence[Sequence[int]], labels: Tensor | None) -> None:
        if labels is not None and len(sequences) != len(labels):
            raise ValueError(f"TokenSequenceDataset: {len(sequences)} sequences but {len(labels)} labels")
        self.lengths = torch.tensor([len(s) for s in sequences], dtype=torch.long)
        self.offsets = torch.zeros(len(sequences) + 1, dtype=torch.long)
        torch.cumsum(self.lengths, 0, out=self.offsets[1:])
        flat = [token for sequence in sequences for token in sequence]
        self.tokens = torch.tensor(flat, dtype=torch.long)
        self.labels = labels.long() if labels is not None else None

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        if self.labels is None:
            return {"input_ids": self.tokens[start:end]}
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

    With ``tokenizer: <a local directory or hub name of a Hugging Face tokenizer>`` (the extra ``loopwise[hf]``)
    the tokenizer is the pretrained model's: its ids (``vocab_size`` is its ``len``), its special tokens around each
    text (``[CLS] ... [SEP]`` for BERT), its padding id (its end-of-text id when it has no padding token) and
    padding side, and ``max_length`` at most its ``model_max_length``; no vocabulary is built (``min_freq`` and
    ``max_vocab_size`` do not apply) and the checkpoint records the tokenizer's name and size.

    Samples are ``{"input_ids": LongTensor (length,), "labels": LongTensor ()}``; batches are dicts with
    ``input_ids`` (B, T) padded with ``pad_id`` = 0, ``attention_mask`` (B, T) (1 on tokens, 0 on padding) and
    ``labels`` (B,), so the network is called as ``model(input_ids=..., attention_mask=...)``. With
    ``bucket_by_length`` the train, val and test batches group texts of similar length (less padding); predict
    batches keep the order of the split or of the file (``predict_path``).

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
            character, case kept; anything else is a Hugging Face tokenizer: a local directory written by
            ``save_pretrained`` or a hub name such as ``prajjwal1/bert-tiny`` (needs ``loopwise[hf]``).
        min_freq: Tokens seen fewer times in the train texts map to ``<unk>``.
        max_vocab_size: At most this many ids in all (``<pad>`` and ``<unk>`` included), the most frequent train
            tokens kept; null for no limit.
        max_length: Keep the first ``max_length`` tokens of each text (special tokens included; at most a Hugging
            Face tokenizer's ``model_max_length``).
        bucket_by_length: Batch texts of similar length together (less padding, faster); batch order is shuffled.
        predict_path: A new CSV or JSONL file of texts (the same format and ``text_field`` as ``path``; the label
            field may be absent and is ignored if present) that ``predict`` classifies record by record, in file
            order, with the vocabulary and class names the model was trained with (restored from the checkpoint,
            never built from this file): unseen tokens become ``<unk>`` and texts are truncated to ``max_length``.
            A prediction's ``row`` is the record's number from 0 (the first record after a CSV header is row 0).
            Default: predict the test split (the val split without one).
    """

    save_init_arguments = True
    #: Id of ``<pad>``: 0 (a Hugging Face tokenizer's own padding id with one).
    pad_id: int = 0
    #: Id of ``<unk>``: 1 (a Hugging Face tokenizer's own unknown-token id with one).
    unk_id: int | None = 1

    def __init__(
        self,
        path: str,
        text_field: str = "text",
        label_field: str = "label",
        tokenizer: str = "word",
        min_freq: int = 1,
        max_vocab_size: int | None = None,
        max_length: int = 256,
        bucket_by_length: bool = False,
        predict_path: str | None = None,
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
        self.hf_tokenizer = None if is_builtin_tokenizer(tokenizer) else HFTokenizer(tokenizer, name)
        if self.hf_tokenizer is not None:
            if min_freq != 1 or max_vocab_size is not None:
                raise ValueError(
                    f"{name}: min_freq and max_vocab_size shape the vocabulary of the word and char tokenizers; the "
                    f"Hugging Face tokenizer {tokenizer!r} has its own: leave them out"
                )
            self.pad_id, self.unk_id = self.hf_tokenizer.pad_id, self.hf_tokenizer.unk_id
            limit = self.hf_tokenizer.max_length
            max_length = max_length if limit is None else min(max_length, limit)
        try:
            self._tokenize = self.hf_tokenizer.tokenize if self.hf_tokenizer is not None else get_tokenizer(tokenizer)
            if predict_path is not None:
                check_text_file_type(predict_path)
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
        self.predict_path = predict_path
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
        (run here if needed); a Hugging Face tokenizer's ``len``."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.vocab_size
        if self.vocabulary is None:
            self.setup()
        assert self.vocabulary is not None
        return len(self.vocabulary)

    def _needs_setup(self) -> bool:
        """Whether the class names (and the word/char vocabulary) are still to be built from the train split."""
        return self._class_names is None or (self.hf_tokenizer is None and self.vocabulary is None)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` (before the vocabulary and truncation)."""
        return self._tokenize(text)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` exactly as in the datasets: encoded, unknown tokens as 1, truncated to max_length
        (a Hugging Face tokenizer's ids, with its special tokens)."""
        if self.hf_tokenizer is not None:
            return self.hf_tokenizer.encode(text, self.max_length)
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
        if self.vocabulary is None and self.hf_tokenizer is None:  # a restored vocabulary is kept
            self.vocabulary = Vocabulary.build(
                (self._tokenize(text) for text in train_inputs),
                min_freq=self.min_freq,
                max_size=self.max_vocab_size,
                specials=(PAD, UNK),
            )

    def make_dataset(self, split: str, inputs: list[str], targets: Tensor) -> Dataset:
        return TokenSequenceDataset([self.encode(text) for text in inputs], targets)

    def collate_fn(self, dataset: Dataset) -> Callable[[Any], Any] | None:
        side = self.hf_tokenizer.padding_side if self.hf_tokenizer is not None else "right"
        return PadCollate(pad_id=self.pad_id, padding_side=side)

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

    # --- new data -----------------------------------------------------------------------------------------------
    def predicts_new_data(self) -> bool:
        return self.predict_path is not None

    def new_data(self) -> tuple[Dataset, list[Any]] | None:
        """The texts of ``predict_path`` encoded as at training time (the checkpoint's vocabulary, unseen tokens as
        ``<unk>``, truncated to ``max_length``), in file order, with their record numbers from 0; labels ignored."""
        if self.predict_path is None:
            return None
        if self._needs_setup():
            self.setup()  # no checkpoint state: the vocabulary of the train split (the one a fit builds)
        try:
            texts, _, _ = read_text_label_file(self.predict_path, self.text_field, None)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{type(self).__name__}: {err}") from None
        return TokenSequenceDataset([self.encode(text) for text in texts], None), list(range(len(texts)))

    def frame_data(self, frame: Any) -> tuple[Dataset, list[Any]]:
        """Raw texts (a DataFrame with the ``text_field`` column; a label column is ignored) encoded as at training
        time, with their row numbers from 0."""
        if self._needs_setup():
            self.setup()
        if self.text_field not in frame.columns:
            raise ValueError(
                f"{type(self).__name__}: the table lacks the text column {self.text_field!r} (columns: "
                f"{[str(c) for c in frame.columns]})"
            )
        texts = ["" if value is None else str(value) for value in frame[self.text_field].tolist()]
        return TokenSequenceDataset([self.encode(text) for text in texts], None), list(range(len(texts)))

    def raw_examples(self, count: int = 5) -> Any:
        """The first ``count`` texts of the data file, as a DataFrame with the ``text_field`` column."""
        import pandas as pd

        texts, _, _ = read_text_label_file(self.path, self.text_field, None)
        return pd.DataFrame({self.text_field: texts[:count]})

    def inference_loader(self, dataset: Dataset) -> DataLoader:
        """In order: no length buckets, so outputs line up with the inputs."""
        self._keep_order = True
        try:
            return super().inference_loader(dataset)
        finally:
            self._keep_order = False

    def predict_dataloader(self) -> DataLoader:
        """Predict the texts of ``predict_path``, or the test split (or val without one), in order: no length
        buckets, so outputs line up with the inputs."""
        self._keep_order = True
        try:
            return super().predict_dataloader()
        finally:
            self._keep_order = False

    # --- checkpoints ----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Vocabulary, class names and tokenizer (plain lists and strings), stored by Lightning in checkpoints; with a
        Hugging Face tokenizer its name and size instead of a vocabulary."""
        if self._needs_setup():
            return {}
        if self.hf_tokenizer is not None:
            return {"class_names": list(self._class_names or []), **self.hf_tokenizer.state_dict()}
        return {
            "vocabulary": self.vocabulary.state_dict(),
            "class_names": list(self._class_names),
            "tokenizer": self.tokenizer,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a saved vocabulary and class names (a Hugging Face tokenizer is checked against the saved name and
        size); datasets already built are rebuilt with them."""
        if not state_dict:
            return
        saved = state_dict.get("tokenizer", self.tokenizer)
        if saved != self.tokenizer:
            raise ValueError(
                f"{type(self).__name__}: the checkpoint was trained with tokenizer={saved!r}, but this "
                f"module has tokenizer={self.tokenizer!r}; set tokenizer: {saved}"
            )
        if self.hf_tokenizer is not None:
            self.hf_tokenizer.check_state(state_dict, type(self).__name__)
        else:
            self.vocabulary = Vocabulary.from_state_dict(state_dict["vocabulary"])
        self._class_names = list(state_dict["class_names"])
        if self.datasets:
            self.datasets = {}
            self.class_counts = None
            self.setup()
