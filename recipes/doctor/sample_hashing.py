"""One hash per sample of a map-style dataset, for the leakage check: identical samples, identical hashes.

A sample is hashed with its inputs and targets (tensors, arrays, numbers, strings, PIL images, nested sequences and
mappings). Two kinds of dataset are read without ``__getitem__``; they say so through small protocols:

- ``TensorRows``: ``tensors``, a tuple of tensors with one row per sample (``TensorDataset``,
  ``BatchedTensorDataset``), hashed row by row;
- ``RawSamples``: ``raw(i)``, the sample's input before augmentation, and ``labels`` (``ImageFolderDataset``): the
  decoded image and its label are hashed, so random augmentation does not hide a duplicate.

Any other dataset is read with ``dataset[i]``. A tensor row hashes to the same value as the same row read through
``dataset[i]`` as a tuple of tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset


class TensorRows(Protocol):
    """A dataset whose samples are the rows of ``tensors`` (each with as many rows as the dataset has samples)."""

    tensors: Sequence[Tensor]

    def __len__(self) -> int: ...


class RawSamples(Protocol):
    """A dataset that can return a sample's input before augmentation (``raw(i)``) and has one label per sample."""

    labels: Any

    def raw(self, index: int) -> Any: ...

    def __len__(self) -> int: ...


def _feed(h: Any, obj: Any) -> None:
    """Feed one sample (tensors, arrays, numbers, strings, nested sequences and mappings) into a hash."""
    if isinstance(obj, Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(f"A{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(obj, (str, bytes, int, float, bool, np.generic)) or obj is None:
        h.update(f"S{type(obj).__name__}:{obj!r}".encode())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(f"{key!r}:".encode())
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (tuple, list)):
        h.update(b"(")
        for item in obj:
            _feed(h, item)
        h.update(b")")
    elif hasattr(obj, "tobytes") and hasattr(obj, "mode") and hasattr(obj, "size"):  # PIL image
        h.update(f"I{obj.mode}{obj.size}".encode())
        h.update(obj.tobytes())
    else:
        raise TypeError(f"cannot hash samples of type {type(obj).__name__}")


def sample_digest(sample: Any) -> bytes:
    """The hash of one sample (16 bytes)."""
    h = hashlib.blake2b(digest_size=16)
    _feed(h, sample)
    return h.digest()


def tensor_rows(dataset: Any, n: int) -> Sequence[Tensor] | None:
    """The dataset's ``tensors`` when it follows ``TensorRows`` (``n`` rows each), else ``None``."""
    tensors = getattr(dataset, "tensors", None)
    if (
        isinstance(tensors, (tuple, list))
        and tensors
        and all(isinstance(t, Tensor) and t.shape[0] == n for t in tensors)
    ):
        return tensors
    return None


def _row_hashes(tensors: Sequence[Tensor], n: int) -> Iterator[bytes]:
    headers = [f"T{t.dtype}{tuple(t.shape[1:])}".encode() for t in tensors]
    rows = [t.detach().cpu().contiguous().reshape(n, -1).view(torch.uint8).numpy() for t in tensors]
    for i in range(n):
        h = hashlib.blake2b(digest_size=16)
        h.update(b"(")
        for header, row in zip(headers, rows):
            h.update(header)
            h.update(row[i].tobytes())
        h.update(b")")
        yield h.digest()


def sample_hashes(dataset: Dataset) -> Iterator[bytes]:
    """One hash per sample of a map-style dataset: its inputs and targets (identical samples, identical hashes).

    Tensor datasets (``.tensors``: ``TensorDataset``, ``BatchedTensorDataset``) are hashed row by row without
    ``__getitem__``; datasets with ``raw(i)`` and ``labels`` (``ImageFolderDataset``) hash the decoded image before
    augmentation; any other dataset is read with ``dataset[i]``.
    """
    n = len(dataset)  # type: ignore[arg-type]
    tensors = tensor_rows(dataset, n)
    if tensors is not None:
        yield from _row_hashes(tensors, n)
        return
    raw, labels = getattr(dataset, "raw", None), getattr(dataset, "labels", None)
    if callable(raw) and labels is not None:
        for i in range(n):
            yield sample_digest((raw(i), labels[i]))
        return
    for i in range(n):
        yield sample_digest(dataset[i])


__all__ = ["RawSamples", "TensorRows", "sample_digest", "sample_hashes", "tensor_rows"]
