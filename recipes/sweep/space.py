"""The search space of ``recipes sweep``: the ``sweep:`` section of a YAML file, and the options that steer a sweep.

A sweep file maps config keys (as ``recipes fit`` names them on the command line, without ``--``) to distributions::

    sweep:
      model.init_args.optimizer.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-1, log: true}
      model.init_args.model.init_args.hidden_sizes: {type: categorical, choices: [[64, 64], [128, 128]]}
      data.init_args.batch_size: {type: int, low: 32, high: 128, step: 32}
    metric: val/acc          # optional: default the task's monitored metric
    direction: maximize      # optional: default from the metric's name
    pruner: median           # optional: median (default), percentile, hyperband, none

Each distribution becomes Optuna's ``suggest_float`` / ``suggest_int`` / ``suggest_categorical``. A categorical
choice may be a list or mapping; Optuna stores it as JSON text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

TYPES = ("float", "int", "categorical")
PRUNERS = ("median", "percentile", "hyperband", "none")
SWEEP_KEYS = ("sweep", "metric", "direction", "pruner")


class SweepSpaceError(ValueError):
    """A search space that cannot be sampled, named with the key and the fix."""


@dataclass(frozen=True)
class Dimension:
    """One swept config key and its distribution."""

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    def example(self) -> Any:
        """One value of the distribution (its low end, or first choice), to check the key before any trial."""
        if self.type == "categorical":
            return self.choices[0]
        return int(self.low) if self.type == "int" else self.low

    def suggest(self, trial: Any) -> Any:
        """The value of this key for ``trial`` (an ``optuna.Trial``)."""
        if self.type == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        encoded = [choice_text(c) for c in self.choices]
        return choice_value(trial.suggest_categorical(self.key, encoded))


def choice_text(choice: Any) -> Any:
    """A categorical choice as Optuna stores it: scalars as they are, lists and mappings as JSON text."""
    return json.dumps(choice) if isinstance(choice, (list, dict)) else choice


def choice_value(stored: Any) -> Any:
    """The choice back from Optuna's stored form."""
    if isinstance(stored, str) and stored[:1] in "[{":
        return json.loads(stored)
    return stored


def dimension(key: str, spec: Any) -> Dimension:
    """Check one entry of ``sweep:`` and build its ``Dimension``."""
    where = f"sweep: {key}"
    if not isinstance(spec, dict):
        raise SweepSpaceError(f"{where}: expected a mapping such as {{type: float, low: 0.001, high: 0.1}}, got {spec!r}")
    kind = spec.get("type")
    if kind not in TYPES:
        raise SweepSpaceError(f"{where}: type must be one of {', '.join(TYPES)}, got {kind!r}")
    unknown = set(spec) - {"type", "low", "high", "log", "step", "choices"}
    if unknown:
        raise SweepSpaceError(f"{where}: unknown field(s) {sorted(unknown)} (fields: type, low, high, log, step, choices)")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SweepSpaceError(f"{where}: a categorical needs choices: [a, b, ...]")
        return Dimension(key, kind, choices=tuple(choices))
    low, high = spec.get("low"), spec.get("high")
    if not isinstance(low, (int, float)) or not isinstance(high, (int, float)) or not math.isfinite(low + high):
        raise SweepSpaceError(f"{where}: a {kind} needs numbers low and high, got low={low!r}, high={high!r}")
    if low >= high:
        raise SweepSpaceError(f"{where}: low ({low}) must be below high ({high})")
    log, step = bool(spec.get("log", False)), spec.get("step")
    if log and low <= 0:
        raise SweepSpaceError(f"{where}: log: true needs low > 0, got {low}")
    if log and step is not None:
        raise SweepSpaceError(f"{where}: step and log: true cannot be combined (Optuna samples one or the other)")
    if kind == "int" and not (float(low).is_integer() and float(high).is_integer()):
        raise SweepSpaceError(f"{where}: an int needs whole low and high, got {low} and {high}")
    return Dimension(key, kind, float(low), float(high), log, None if step is None else float(step))


@dataclass(frozen=True)
class SweepFile:
    """A parsed sweep file: the dimensions and the optional ``metric``, ``direction`` and ``pruner``."""

    path: str
    dimensions: tuple[Dimension, ...]
    metric: str | None = None
    direction: str | None = None
    pruner: str | None = None

    def space(self) -> dict[str, Any]:
        """The raw search space (for the parent run's record)."""
        return {d.key: {k: v for k, v in vars(d).items() if k != "key" and v not in (None, (), False)}
                for d in self.dimensions}


def is_sweep_file(path: str | Path) -> bool:
    """Whether ``path`` is a YAML file with a top-level ``sweep:`` section."""
    try:
        content = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(content, dict) and "sweep" in content


def read_sweep_file(path: str | Path) -> SweepFile:
    """Parse and check a sweep file; ``SweepSpaceError`` names the problem."""
    try:
        content = yaml.safe_load(Path(path).read_text())
    except OSError as err:
        raise SweepSpaceError(f"cannot read the sweep file {path}: {err}") from None
    except yaml.YAMLError as err:
        raise SweepSpaceError(f"the sweep file {path} is not valid YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(content, dict) or not isinstance(content.get("sweep"), dict) or not content["sweep"]:
        raise SweepSpaceError(f"{path}: expected a 'sweep:' mapping of config keys to distributions")
    extra = set(content) - set(SWEEP_KEYS)
    if extra:
        raise SweepSpaceError(
            f"{path}: a sweep file holds only {', '.join(SWEEP_KEYS)}; move {sorted(extra)} to the recipe's config"
        )
    direction = content.get("direction")
    if direction not in (None, "minimize", "maximize"):
        raise SweepSpaceError(f"{path}: direction must be minimize or maximize, got {direction!r}")
    pruner = content.get("pruner")
    if pruner not in (None, *PRUNERS):
        raise SweepSpaceError(f"{path}: pruner must be one of {', '.join(PRUNERS)}, got {pruner!r}")
    dimensions = tuple(dimension(str(key).removeprefix("--"), spec) for key, spec in content["sweep"].items())
    return SweepFile(str(path), dimensions, content.get("metric"), direction, pruner)


def as_cli_value(value: Any) -> str:
    """A sampled value as a ``recipes fit`` command-line value (JSON for lists, mappings, booleans and None)."""
    if isinstance(value, (list, dict, bool)) or value is None:
        return json.dumps(value)
    return str(value)


__all__ = ["Dimension", "SweepFile", "SweepSpaceError", "as_cli_value", "is_sweep_file", "read_sweep_file"]
