"""The data guard: ``validate``, ``test`` and ``predict`` evaluate the split the model was trained against.

A checkpoint written by a recipe stores its data module's settings (``datamodule_hyper_parameters``). An evaluation
whose data settings differ from those (another ``seed``, other split fractions, another file, other preprocessing)
would evaluate on other rows, some of which the model may have trained on: that is an error before anything runs,
naming each differing setting with both values. ``--allow_data_change true`` evaluates anyway and records the
differences as the run tag ``loopwise.allow_data_change``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from datamodules.recipe_contract import settings_outside_split

EVALUATION_STAGES = ("validate", "test", "predict")
# settings that do not change which rows are in a split: the loaders' and the new data's to predict (a data class
# names its own: ``datamodules.recipe_contract.SettingsOutsideSplit``); these are the defaults
LOADER_SETTINGS = settings_outside_split(None)
ALLOW_TAG = "loopwise.allow_data_change"


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
    trained: Mapping[str, Any] | None, now: Mapping[str, Any], ignored: frozenset[str] = LOADER_SETTINGS
) -> list[DataChange]:
    """The settings of ``trained`` (a checkpoint's ``datamodule_hyper_parameters``) that ``now`` (this run's data
    ``init_args``) sets to another value. The ``ignored`` settings (the loaders' and the new data's), Lightning's
    bookkeeping keys (``_class_path``, ...) and settings one side does not have (a checkpoint from an older loopwise)
    are not compared."""
    if not trained:
        return []
    changes = []
    for name, value in trained.items():
        if name.startswith("_") or name in ignored or name not in now:
            continue
        if comparable(value) != comparable(now[name]):
            changes.append(DataChange(name, value, now[name]))
    return changes


class DataSettingsChanged(ValueError):
    """An evaluation's data settings differ from the ones the checkpoint was trained with."""


def guard_data_settings(
    ckpt_path: str, stage: str, trained: Mapping[str, Any] | None, now: Mapping[str, Any], allow: bool,
    ignored: frozenset[str] = LOADER_SETTINGS,
) -> list[DataChange]:
    """For ``validate``/``test``/``predict``: raise ``DataSettingsChanged`` (one line, with the fix) when the data settings
    differ from the checkpoint's, unless ``allow``; return the differences (empty for ``fit`` and matching data)."""
    if stage not in EVALUATION_STAGES:
        return []
    changes = data_changes(trained, now, ignored)
    if changes and not allow:
        flags = " ".join(f"--data.init_args.{c.name} {c.trained}" for c in changes)
        raise DataSettingsChanged(
            f"--ckpt_path {ckpt_path} was trained with other data settings ("
            + "; ".join(c.describe() for c in changes)
            + f"): `{stage}` would not use the split the model was trained against, and may score rows it trained "
            f"on. Pass {flags} to match it, or --allow_data_change true to {stage} on this data anyway (recorded as "
            f"the run tag {ALLOW_TAG})"
        )
    return changes


__all__ = ["ALLOW_TAG", "DataChange", "DataSettingsChanged", "data_changes", "guard_data_settings"]
