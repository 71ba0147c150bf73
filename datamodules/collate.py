"""Collate variable-length token sequences into padded batches with an attention mask.

The batch is a dict whose keys other than ``labels`` a ``Task`` passes to the network as keyword arguments
(``input_ids``, ``attention_mask``, ...). Sequence labels are padded with ``-100``, the default ``ignore_index`` of
``torch.nn.functional.cross_entropy``, so padded positions add nothing to the loss. Padding goes after each sequence
(``padding_side="right"``, the default) or before it (``"left"``, for a Hugging Face tokenizer that says so).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

INPUT_KEY = "input_ids"
LABEL_KEY = "labels"
MASK_KEY = "attention_mask"
PADDING_SIDES = ("right", "left")


def pad_sequences(values: list[Tensor], padding_value: int, left: bool = False) -> Tensor:
    """1-D tensors stacked into ``(B, T_max)``, padded with ``padding_value`` after (or, ``left``, before) each."""
    if not left:
        return pad_sequence(values, batch_first=True, padding_value=padding_value)
    flipped = pad_sequence([v.flip(0) for v in values], batch_first=True, padding_value=padding_value)
    return flipped.flip(1)


def _as_tensor(value: Any, key: str, index: int) -> Tensor:
    """``value`` as a tensor, or a ValueError naming the key and the sample."""
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(
            f"pad_collate: {key!r} of sample {index} is not a number or a sequence of numbers: {value!r:.80}"
        ) from err


def _input_ids(sample: Any, index: int) -> Tensor:
    """The sample's ``input_ids`` as a non-empty 1-D LongTensor."""
    if not isinstance(sample, Mapping):
        raise ValueError(f"pad_collate: sample {index} must be a dict with {INPUT_KEY!r}, got {type(sample).__name__}")
    if INPUT_KEY not in sample:
        raise ValueError(f"pad_collate: sample {index} has no {INPUT_KEY!r} (keys: {sorted(sample)})")
    ids = _as_tensor(sample[INPUT_KEY], INPUT_KEY, index)
    if ids.ndim != 1:
        raise ValueError(
            f"pad_collate: {INPUT_KEY!r} of sample {index} must be one-dimensional, got shape {tuple(ids.shape)}"
        )
    if len(ids) == 0:
        raise ValueError(f"pad_collate: sample {index} has no tokens; an empty sequence cannot be attended to")
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ValueError(f"pad_collate: {INPUT_KEY!r} of sample {index} must be token ids (ints), got {ids.dtype}")
    return ids.long()


def _collate_key(values: list[Tensor], key: str, lengths: list[int], padding_value: int, left: bool) -> Tensor:
    """Stack scalars into (B,) or pad 1-D sequences as long as their ``input_ids`` into (B, T_max)."""
    scalar = [v.ndim == 0 for v in values]
    if all(scalar):
        return torch.stack(values)
    if any(scalar):
        first = scalar.index(True)
        raise ValueError(
            f"pad_collate: {key!r} is a scalar in sample {first} but a sequence in sample {scalar.index(False)}"
        )
    for index, (value, length) in enumerate(zip(values, lengths)):
        if value.ndim != 1 or len(value) != length:
            raise ValueError(
                f"pad_collate: {key!r} of sample {index} has shape {tuple(value.shape)}, but a sequence key must "
                f"match {INPUT_KEY!r}, which has {length} tokens"
            )
    return pad_sequences(values, padding_value, left)


def pad_collate(
    batch: Sequence[Mapping[str, Any]], pad_id: int = 0, label_pad_id: int = -100, padding_side: str = "right"
) -> dict[str, Tensor]:
    """Collate token-sequence samples into a padded batch with an attention mask.

    Each sample is a dict with ``input_ids`` (a list of ints or a 1-D LongTensor) and optionally ``labels``: an int
    (sequence classification) or a sequence of ints as long as ``input_ids`` (token-level targets, e.g. language
    modelling). Other keys hold 1-D sequences as long as ``input_ids`` (padded with 0; an ``attention_mask`` given
    by the samples is kept) or scalars (stacked).

    Returns ``input_ids`` (B, T_max) padded with ``pad_id`` (after each sequence, or before it with
    ``padding_side="left"``); ``attention_mask`` (B, T_max), 1 on real tokens and 0 on padding; ``labels`` (B,) for
    scalar labels, or (B, T_max) padded with ``label_pad_id`` for sequence labels.
    Integer labels are int64; float scalar labels (regression) keep a floating dtype.

    Args:
        batch: The samples of one batch.
        pad_id: Token id that fills ``input_ids`` after the end of each sequence.
        label_pad_id: Label of padded positions; the default -100 is ``cross_entropy``'s default ``ignore_index``,
            so they add nothing to the loss.
        padding_side: "right": padding after each sequence; "left": before it.
    """
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"pad_collate: padding_side must be 'right' or 'left', got {padding_side!r}")
    left = padding_side == "left"
    if len(batch) == 0:
        raise ValueError("pad_collate: the batch is empty")
    ids = [_input_ids(sample, index) for index, sample in enumerate(batch)]
    lengths = [len(x) for x in ids]
    keys = list(batch[0].keys())
    for index, sample in enumerate(batch):
        if set(sample.keys()) != set(keys):
            raise ValueError(
                f"pad_collate: sample {index} has keys {sorted(sample)} but sample 0 has {sorted(keys)}; all samples "
                "of a batch need the same keys"
            )
    out: dict[str, Tensor] = {INPUT_KEY: pad_sequences(ids, pad_id, left)}
    if MASK_KEY not in keys:
        width, counts = out[INPUT_KEY].shape[1], torch.tensor(lengths)[:, None]
        positions = torch.arange(width)
        out[MASK_KEY] = (positions >= width - counts if left else positions < counts).long()
    for key in keys:
        if key == INPUT_KEY:
            continue
        values = [_as_tensor(sample[key], key, index) for index, sample in enumerate(batch)]
        if key == LABEL_KEY:
            for index, value in enumerate(values):
                if value.ndim == 1 and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
                    raise ValueError(
                        f"pad_collate: sequence {LABEL_KEY!r} of sample {index} must be ints (class or token ids), "
                        f"got {value.dtype}"
                    )
            values = [v.long() if not (v.is_floating_point() or v.is_complex()) else v for v in values]
            out[key] = _collate_key(values, key, lengths, label_pad_id, left)
        else:
            out[key] = _collate_key(values, key, lengths, 0, left)
    return out


class PadCollate:
    """A picklable ``collate_fn`` that calls ``pad_collate`` with fixed padding ids.

    Pass it to a ``DataLoader`` (it works with ``num_workers > 0``) or configure it in YAML.

    Args:
        pad_id: Token id that fills ``input_ids`` after the end of each sequence.
        label_pad_id: Label of padded positions (default -100: ignored by ``cross_entropy``).
        padding_side: "right": padding after each sequence; "left": before it.
    """

    def __init__(self, pad_id: int = 0, label_pad_id: int = -100, padding_side: str = "right") -> None:
        if padding_side not in PADDING_SIDES:
            raise ValueError(f"PadCollate: padding_side must be 'right' or 'left', got {padding_side!r}")
        self.pad_id = pad_id
        self.label_pad_id = label_pad_id
        self.padding_side = padding_side

    def __call__(self, batch: Sequence[Mapping[str, Any]]) -> dict[str, Tensor]:
        """Collate ``batch`` with this object's padding ids.

        Args:
            batch: The samples of one batch.
        """
        return pad_collate(batch, pad_id=self.pad_id, label_pad_id=self.label_pad_id, padding_side=self.padding_side)

    def __repr__(self) -> str:
        side = "" if self.padding_side == "right" else f", padding_side={self.padding_side!r}"
        return f"{type(self).__name__}(pad_id={self.pad_id}, label_pad_id={self.label_pad_id}{side})"
