"""Leakage through initial weights: this run's validation and test rows that its ``init_from`` was trained on.

A task's ``init_from`` (a checkpoint file, ``run:<id>/best|last``, ``mlflow:<id>/best|last``) may be weights trained
on the same table with another seed or other split fractions: then some of this run's validation and test rows were
training rows of the starting weights, and this run's val/test scores are not held-out estimates.

``init_from_overlap`` tells, once per fit on rank 0, before training:

* the same source: the checkpoint's ``loopwise_data["source"]`` digest is this run's source digest (the digest of its
  dataset inputs); for an older checkpoint without it, the digest of the data file its settings name, when that file
  is still there; for generated data (no file), the same data class with the same settings apart from the split's
  fractions and the loaders'. Another source: nothing to compare.
* the starting weights' training split, rebuilt: this run's data module class (never a class named in the file: a
  file never chooses what code runs) with the checkpoint's data settings and this run's file, ``setup("fit")``.
* the overlap, by row ids: the data module's ``split_rows`` (``datamodules.recipe_contract.SplitRows``, the
  source's row numbers in each split; the same numbers are the same rows of the same content). A data module
  without them is compared by content (``recipes.doctor.sample_hashing``), with this run's data state (its
  encoding) loaded into the rebuilt module first, so that equal rows encode alike.

A source of more than ``MAX_ROWS`` rows is not rebuilt (one info line says so): rebuilding reads and encodes the
whole source once more while the fit's own copy is held. Measured on a 1,000,000-row, 8-column CSV (88 MB, 2 CPU
threads): 2.0 s for the whole check (the fit's own setup of that table: 1.5-2.5 s) and 146 MB more peak memory;
both grow with the rows, so a 10-million-row table would add about 20 s and 1.5 GB to the start of every fit.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from datamodules.recipe_contract import (
    data_state_of,
    load_data_state,
    settings_outside_split,
    source_paths_of,
    split_datasets_of,
    split_rows_of,
)
from recipes.checkpoints.data_guard import DataChange, data_changes
from recipes.checkpoints.files import load_checkpoint_weights_only
from recipes.doctor.sample_hashing import sample_hashes
from recipes.tracking.dataset_inputs import data_settings, data_source, file_digest

#: Sources with more rows than this are not rebuilt (see the module docstring)
MAX_ROWS = 1_000_000
#: The run tag of the counts: ``val 37/60, test 41/60``
OVERLAP_TAG = "loopwise.init_from_overlap"
#: The checkpoint key with the content digests of the data it was trained on (``{"source": ..., "splits": ...}``)
DATA_KEY = "loopwise_data"
#: Settings that choose which rows a split holds, not which rows a generated source has
SPLIT_SETTINGS = frozenset({"val_fraction", "test_fraction", "stratify"})
#: Settings naming the source itself: this run's are used in the rebuild (the same content, perhaps another path)
SOURCE_SETTINGS = ("path", "root")
EVALUATION_SPLITS = (("val", "validation"), ("test", "test"))


@dataclass(frozen=True)
class Overlap:
    """How many of this run's rows of each evaluation split were training rows of the starting weights."""

    reference: str  # init_from as the config gives it
    counts: dict[str, tuple[int, int]]  # split -> (rows in the starting weights' train split, rows of the split)
    changes: list[DataChange]  # the data settings of the starting run that differ from this run's
    compared_by: str  # "row ids" or "row content"

    @property
    def shared(self) -> bool:
        """Whether any validation or test row was a training row of the starting weights."""
        return any(shared for shared, _ in self.counts.values())

    def tag(self) -> str:
        """``val 37/60, test 41/60`` (the run tag ``loopwise.init_from_overlap``)."""
        return ", ".join(f"{split} {shared}/{total}" for split, (shared, total) in self.counts.items())

    def warning(self) -> str:
        """The one warning line (without the ``recipes: warning:`` prefix)."""
        names = dict(EVALUATION_SPLITS)
        owners = ["this run's"] + ["its"] * len(self.counts)
        parts = [f"{shared} of {owner} {total} {names[split]} rows"
                 for owner, (split, (shared, total)) in zip(owners, self.counts.items())]
        differs = ", ".join(f"{c.name} {c.now!r} vs {c.trained!r}" for c in self.changes) or "the same settings"
        return (
            f"init_from {self.reference} was trained on {' and '.join(parts)} (same data, {differs}; compared by "
            f"{self.compared_by}): val/test scores of this run are not held-out estimates; use the same seed and "
            "fractions as the starting run, or start from weights that never saw this table"
        )


def checkpoint_content(file: str | Path) -> dict[str, Any] | None:
    """The checkpoint's content (weights-only), ``None`` for a file that is not a Lightning checkpoint."""
    if Path(file).suffix.lower() != ".ckpt":
        return None
    try:
        content = load_checkpoint_weights_only(file)
    except ValueError:
        return None
    return content if isinstance(content, dict) else None


def recorded_source_digest(trained: Mapping[str, Any], stored: Any) -> str | None:
    """The source digest the checkpoint records, else the digest of the data file its settings name (if there)."""
    if isinstance(stored, Mapping) and stored.get("source"):
        return str(stored["source"])
    for name in SOURCE_SETTINGS:
        value = trained.get(name)
        if isinstance(value, (str, Path)) and Path(value).exists():
            return file_digest(Path(value))
    return None


def same_source(datamodule: Any, trained: Mapping[str, Any], stored: Any) -> bool:
    """Whether the checkpoint's data has this run's source content (see the module docstring)."""
    kind, source, _ = data_source(datamodule)
    if kind == "local":
        return recorded_source_digest(trained, stored) == source["source_digest"]
    if source_paths_of(datamodule):
        return False  # a file that is not there: nothing to compare
    trained_class = str(trained.get("_class_path", "")).rsplit(".", 1)[-1]
    if trained_class and trained_class != type(datamodule).__name__:
        return False
    ignored = settings_outside_split(type(datamodule)) | SPLIT_SETTINGS
    return not data_changes(trained, data_settings(datamodule), ignored)


def rebuild_arguments(datamodule: Any, trained: Mapping[str, Any]) -> dict[str, Any]:
    """The checkpoint's data settings for this run's class: its split settings, this run's source and loaders."""
    now = data_settings(datamodule)
    kept = settings_outside_split(type(datamodule)) | frozenset(SOURCE_SETTINGS)
    arguments = {k: v for k, v in trained.items() if not k.startswith("_") and k not in kept}
    arguments.update({k: v for k, v in now.items() if k in kept and not k.startswith("_")})
    parameters = inspect.signature(type(datamodule).__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        arguments = {k: v for k, v in arguments.items() if k in parameters}
    return arguments


def rebuilt_training_rows(datamodule: Any, trained: Mapping[str, Any]) -> Any:
    """The starting weights' data module: this run's class with the checkpoint's settings, set up for ``fit``."""
    with warnings.catch_warnings():  # the rebuild's warnings were the starting run's (and this run's) already
        warnings.simplefilter("ignore")
        rebuilt = type(datamodule)(**rebuild_arguments(datamodule, trained))
        if split_rows_of(datamodule) is None:
            load_data_state(rebuilt, data_state_of(datamodule))  # this run's encoding: equal rows encode alike
        rebuilt.setup("fit")
    return rebuilt


def count_rows(datamodule: Any, rebuilt: Any) -> tuple[dict[str, tuple[int, int]], str] | None:
    """Per evaluation split of this run: (rows among the rebuilt train rows, rows); and how they were compared."""
    mine, theirs = split_rows_of(datamodule), split_rows_of(rebuilt)
    if mine is not None and theirs is not None and "train" in theirs:
        return {split: (int(torch.isin(mine[split], theirs["train"]).sum()), len(mine[split]))
                for split, _ in EVALUATION_SPLITS if split in mine and len(mine[split])}, "row ids"
    datasets, rebuilt_sets = split_datasets_of(datamodule), split_datasets_of(rebuilt)
    if not datasets or not rebuilt_sets or "train" not in rebuilt_sets:
        return None
    train_hashes = set(sample_hashes(rebuilt_sets["train"]))
    counts = {}
    for split, _ in EVALUATION_SPLITS:
        dataset = datasets.get(split)
        if dataset is not None and len(dataset):  # type: ignore[arg-type]
            hashes = list(sample_hashes(dataset))
            counts[split] = (sum(h in train_hashes for h in hashes), len(hashes))
    return counts, "row content"


def source_rows(datamodule: Any) -> int:
    """Rows of this run's source: the sum of its splits' sizes."""
    datasets = split_datasets_of(datamodule) or {}
    return sum(len(ds) for ds in datasets.values() if hasattr(ds, "__len__"))  # type: ignore[arg-type]


def init_from_overlap(
    reference: str, file: str | Path, datamodule: Any, max_rows: int = MAX_ROWS
) -> Overlap | str | None:
    """The overlap of this run's validation and test rows with the training rows of ``file``, the checkpoint that
    ``init_from`` (``reference``) loaded, for a ``datamodule`` set up for ``fit``: an ``Overlap`` when the source is
    the same, ``None`` when it is another (or the file says nothing of its data), a line saying why it was not
    compared when the source is too large or the split cannot be rebuilt."""
    content = checkpoint_content(file)
    trained = content.get("datamodule_hyper_parameters") if content else None
    if not isinstance(trained, Mapping) or datamodule is None or not same_source(
            datamodule, trained, content.get(DATA_KEY) if content else None):
        return None
    rows = source_rows(datamodule)
    if rows > max_rows:
        return (f"init_from {reference} was trained on this run's data; its training split is not rebuilt for "
                f"{rows:,} rows (more than {max_rows:,}): whether this run's val/test rows were among them is not "
                "checked")
    changes = data_changes(trained, data_settings(datamodule), settings_outside_split(type(datamodule)))
    try:
        counted = count_rows(datamodule, rebuilt_training_rows(datamodule, trained))
    except Exception as err:  # noqa: BLE001  (any data module's own error: the fit goes on, the line says why)
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        return f"init_from {reference}: its training split could not be rebuilt to compare rows ({reason})"
    if counted is None or not counted[0]:
        return None  # nothing to compare with, or no validation or test rows
    counts, compared_by = counted
    return Overlap(reference, counts, [c for c in changes if c.name not in SOURCE_SETTINGS], compared_by)


__all__ = ["MAX_ROWS", "OVERLAP_TAG", "Overlap", "init_from_overlap"]
