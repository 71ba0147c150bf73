"""The data a run used, as MLflow dataset inputs: which data, which split, and a digest of its content.

For every split a command uses (fit: train and val; validate: val; test: test; predict: the rows it predicts) the
run gets one MLflow dataset input with the context tag ``mlflow.data.context`` = the split:

* name: the data's file name (``churn.csv``) or the data module's class (``SpiralDataModule``), then ``/<split>``;
* digest: SHA-256 (first 32 hex digits) of the split's tensors, their bytes, shapes and dtypes, after the split and
  preprocessing; for a dataset without tensors, of the source's bytes with the split's name and size. The same data
  gives the same digest in any directory; one changed byte of the file gives another;
* source: the file or folder (``local``), or the data module's class and settings (``code``), with the digest of the
  source's own bytes;
* schema: the tensors' shapes and dtypes; profile: the split's size and, for class labels, the count per class.

Two runs with the same digest saw the same rows. Written once per command, on rank 0, by the callback
``recipes.callbacks.data_inputs.DataInputs``; this module computes the records.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
import torch

from datamodules.recipe_contract import new_data_of, source_digest_of, source_paths_of, split_datasets_of

SPLITS_OF_STAGE = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}
DIGEST_LENGTH = 32


def tensor_digest(tensors: list[torch.Tensor]) -> str:
    """SHA-256 of the tensors' shapes, dtypes and bytes."""
    digest = hashlib.sha256()
    for tensor in tensors:
        value = tensor.detach().cpu().contiguous()
        digest.update(f"{tuple(value.shape)}:{value.dtype};".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest.hexdigest()[:DIGEST_LENGTH]


# file_digest's results by (path, (file, size, mtime, ctime, inode) of each file): one command (the dataset inputs, the
# checkpoint's data content, the data guard, each ``best``/``last`` candidate) reads a large file's bytes once
_DIGESTS: dict[tuple[Any, ...], str] = {}


def file_digest(path: Path, cached: bool = True) -> str:
    """SHA-256 of a file's bytes, or of a folder's files (relative names and bytes, in sorted order).

    Computed once per process for the same unchanged files (same size, modification and change times, inode);
    ``cached=False`` reads the bytes again (and keeps the result)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
    stats = [(file, file.stat()) for file in files]
    key = (str(path.resolve()), tuple((str(f), s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino) for f, s in stats))
    if cached and key in _DIGESTS:
        return _DIGESTS[key]
    digest = hashlib.sha256()
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    _DIGESTS[key] = digest.hexdigest()[:DIGEST_LENGTH]
    return _DIGESTS[key]


def data_source(datamodule: Any) -> tuple[str, dict[str, Any], str]:
    """(source type, source description, name) of a data module: its file or folder (its own ``source_digest``, or
    the bytes'), else its class and settings."""
    own = source_digest_of(datamodule)
    if own is not None:
        paths = [str(v) for v in source_paths_of(datamodule) if isinstance(v, (str, Path))]
        uri = paths[0] if paths else type(datamodule).__name__
        local = "://" not in uri and Path(uri).exists()
        uri = str(Path(uri).resolve()) if local else uri
        return "local" if local else "uri", {"uri": uri, "source_digest": own}, Path(uri).name or uri
    for value in source_paths_of(datamodule):
        if isinstance(value, (str, Path)) and Path(value).exists():
            path = Path(value).resolve()
            return "local", {"uri": str(path), "source_digest": file_digest(path)}, path.name
    settings = {k: v for k, v in data_settings(datamodule).items()
                if isinstance(v, (int, float, str, bool, list, type(None)))}
    cls = type(datamodule)
    return "code", {"class": f"{cls.__module__}.{cls.__qualname__}", "settings": settings}, cls.__name__


def data_settings(datamodule: Any) -> dict[str, Any]:
    """The data module's settings: Lightning's ``hparams`` of a ``LightningDataModule`` (none for other objects)."""
    return dict(datamodule.hparams or {}) if isinstance(datamodule, LightningDataModule) else {}


def dataset_tensors(dataset: Any) -> list[torch.Tensor] | None:
    """The tensors of an in-memory dataset (``BatchedTensorDataset``, ``TensorDataset``), else ``None``."""
    tensors = getattr(dataset, "tensors", None)
    if isinstance(tensors, (list, tuple)) and tensors and all(isinstance(t, torch.Tensor) for t in tensors):
        return list(tensors)
    return None


def split_record(datamodule: Any, split: str, dataset: Any) -> dict[str, Any]:
    """Name, digest, source, schema and profile of one split."""
    source_type, source, name = data_source(datamodule)
    tensors = dataset_tensors(dataset)
    size = len(dataset) if hasattr(dataset, "__len__") else None
    if tensors is not None:
        digest = tensor_digest(tensors)
        schema = {"tensors": [{"shape": list(t.shape), "dtype": str(t.dtype)} for t in tensors]}
    else:
        # the source's bytes (not where it lies) and the settings that choose the split's rows
        settings = {k: v for k, v in data_settings(datamodule).items()
                    if not (isinstance(v, str) and Path(v).exists())}
        identity = [source.get("source_digest", source.get("settings")), settings, split, size]
        fallback = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode())
        digest, schema = fallback.hexdigest()[:DIGEST_LENGTH], {"type": type(dataset).__name__}
    profile: dict[str, Any] = {"num_rows": size}
    labels = tensors[-1] if tensors is not None and len(tensors) > 1 else None
    if labels is not None and labels.ndim == 1 and not labels.is_floating_point() and labels.numel():
        profile["class_counts"] = torch.bincount(labels.long().clamp(min=0)).tolist()
    return {"name": f"{name}/{split}", "digest": digest, "source_type": source_type, "source": source,
            "schema": schema, "profile": profile, "context": split}


def stage_splits(datamodule: Any, stage: str) -> dict[str, Any]:
    """The datasets a command of ``stage`` uses, by split."""
    datasets = dict(split_datasets_of(datamodule) or {})
    if stage == "predict":
        fresh = new_data_of(datamodule)
        return {"predict": fresh[0]} if fresh else ({"predict": datasets["test"]} if "test" in datasets else {})
    return {split: datasets[split] for split in SPLITS_OF_STAGE.get(stage, ()) if split in datasets}


__all__ = ["data_source", "file_digest", "split_record", "stage_splits", "tensor_digest"]
