"""The data guard: ``validate``, ``test`` and ``predict`` evaluate the split the model was trained against.

A checkpoint written by a recipe stores its data module's settings (``datamodule_hyper_parameters``) and the content
digest of its source file or folder (``checkpoint["loopwise_data"]``: ``recipes.checkpoints.data_content``). An
evaluation whose data differs (a source file edited, replaced or reordered; another ``seed``, other split fractions,
other preprocessing) would evaluate on other rows, some of which the model may have trained on: that is an error
before anything runs, naming what differs with both values. The source is compared by content, not by where it
lies: the same bytes under another path or name are the same data (the path settings, ``path`` and ``root``, are then
not compared); a checkpoint without the digest (an older loopwise's) compares the path settings as text.
``--allow_data_change true`` evaluates anyway and records the differences as the run tag
``loopwise.allow_data_change``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from datamodules.parquet_source import METADATA_DIGEST, ParquetSource
from datamodules.recipe_contract import settings_outside_split
from recipes.checkpoints.data_content import DATA_KEY
from recipes.tracking.dataset_inputs import file_digest

EVALUATION_STAGES = ("validate", "test", "predict")
# settings that do not change which rows are in a split: the loaders' and the new data's to predict (a data class
# names its own: ``datamodules.recipe_contract.SettingsOutsideSplit``); these are the defaults
LOADER_SETTINGS = settings_outside_split(None)
ALLOW_TAG = "loopwise.allow_data_change"
# the settings that name the source (``datamodules.recipe_contract``'s ``DataFile.path``, ``DataFolder.root``): compared
# by the content they point to when the checkpoint has its digest
SOURCE_SETTINGS = ("path", "root")
SOURCE_CONTENT = "source content"
SHORT_DIGEST = 8


@dataclass(frozen=True)
class DataChange:
    """One data setting whose value differs between the checkpoint and this run."""

    name: str
    trained: Any
    now: Any

    def describe(self) -> str:
        return f"{self.name} {self.trained!r} in the checkpoint, {self.now!r} now"

    def tag(self) -> str:
        return f"{self.name}: {self.trained!r} -> {self.now!r}"


@dataclass(frozen=True)
class ContentChange(DataChange):
    """The source's bytes differ from the ones the checkpoint was trained on (``trained``, ``now``: short digests;
    ``source``: the path setting as this run gives it)."""

    source: str = ""

    def describe(self) -> str:
        return (
            f"the source's content differs from the one this checkpoint was trained on (digest {self.trained} vs "
            f"{self.now}: {self.source} edited, replaced or reordered since)"
        )


def source_of(now: Mapping[str, Any]) -> tuple[str, Path] | None:
    """The first source setting of ``now`` (``path``, then ``root``) that names an existing file or folder."""
    for name in SOURCE_SETTINGS:
        value = now.get(name)
        if isinstance(value, (str, PurePath)) and str(value) and Path(value).exists():
            return name, Path(value)
    return None


def content_changes(content: Any, now: Mapping[str, Any]) -> tuple[list[DataChange], frozenset[str]]:
    """The source's content against ``content`` (a checkpoint's ``loopwise_data``): a ``ContentChange`` when its
    digest differs, and the settings the content comparison stands for (not compared as text then). Without a
    source digest (an older checkpoint, a generated source) or a source file here, nothing is compared by content."""
    trained = content.get("source") if isinstance(content, Mapping) else None
    found = source_of(now)
    if not isinstance(trained, str) or found is None:
        return [], frozenset()
    name, path = found
    if trained.endswith(METADATA_DIGEST):  # a streamed table's: its Parquet metadata, never a full read
        try:
            digest = ParquetSource(str(path)).fingerprint
        except (OSError, ValueError) as error:
            digest = f"unreadable ({error})"
    else:
        digest = file_digest(path.resolve())
    if digest == trained:
        return [], frozenset(SOURCE_SETTINGS)
    change = ContentChange(SOURCE_CONTENT, trained[:SHORT_DIGEST], digest[:SHORT_DIGEST], str(now[name]))
    return [change], frozenset(SOURCE_SETTINGS)


def comparable(value: Any) -> Any:
    """A value as both sides can hold it: tuples as lists, paths as strings, mappings as plain dicts."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): comparable(v) for k, v in value.items()}
    return value


def data_changes(
    trained: Mapping[str, Any] | None, now: Mapping[str, Any], ignored: frozenset[str] = LOADER_SETTINGS,
    content: Any = None,
) -> list[DataChange]:
    """The source content (``content_changes``: ``content`` is the checkpoint's ``loopwise_data``) and the settings of
    ``trained`` (a checkpoint's ``datamodule_hyper_parameters``) that ``now`` (this run's data ``init_args``) sets to
    another value. The ``ignored`` settings (the loaders' and the new data's), the source settings when the content
    is compared, Lightning's bookkeeping keys (``_class_path``, ...) and settings one side does not have (a
    checkpoint from an older loopwise) are not compared."""
    if not trained:
        return []
    changes, by_content = content_changes(content, now)
    for name, value in trained.items():
        if name.startswith("_") or name in ignored or name in by_content or name not in now:
            continue
        if comparable(value) != comparable(now[name]):
            changes.append(DataChange(name, value, now[name]))
    return changes


class DataSettingsChanged(ValueError):
    """An evaluation's data settings differ from the ones the checkpoint was trained with."""


def guard_data_settings(
    ckpt_path: str, stage: str, trained: Mapping[str, Any] | None, now: Mapping[str, Any], allow: bool,
    ignored: frozenset[str] = LOADER_SETTINGS, content: Any = None,
) -> list[DataChange]:
    """For ``validate``/``test``/``predict``: raise ``DataSettingsChanged`` (one line, with the fix) when the source's
    content (``content``: the checkpoint's ``loopwise_data``) or the data settings differ from the checkpoint's,
    unless ``allow``; return the differences (empty for ``fit`` and matching data)."""
    if stage not in EVALUATION_STAGES:
        return []
    changes = data_changes(trained, now, ignored, content)
    if changes and not allow:
        edited = [c for c in changes if isinstance(c, ContentChange)]
        settings = [c for c in changes if not isinstance(c, ContentChange)]
        flags = " ".join(f"--data.init_args.{c.name} {c.trained}" for c in settings)
        what = [c.describe() for c in edited]
        if settings:
            described = "; ".join(c.describe() for c in settings)
            what.append(("and it was trained with " if edited else "") + f"other data settings ({described})")
        fixes = (["use the file it was trained on"] if edited else []) + ([f"pass {flags}"] if flags else [])
        fix = " and ".join(fixes)
        if edited:
            opening = f"--ckpt_path {ckpt_path}: " + "; ".join(what)
        else:
            opening = f"--ckpt_path {ckpt_path} was trained with " + what[0]
        raise DataSettingsChanged(
            opening
            + f": `{stage}` would not use the split the model was trained against, and may score rows it trained "
            f"on. {fix[0].upper() + fix[1:]} to match it, or --allow_data_change true to {stage} on this data anyway "
            f"(recorded as the run tag {ALLOW_TAG})"
        )
    return changes


__all__ = [
    "ALLOW_TAG", "DATA_KEY", "ContentChange", "DataChange", "DataSettingsChanged", "content_changes", "data_changes",
    "guard_data_settings",
]
