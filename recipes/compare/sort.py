"""``recipes compare --sort KEY[:asc|:desc]``: the order of the rows in each table.

Keys: ``best``, ``last`` (the table's metric; default better first: lowest for losses and errors, highest for
scores), ``start`` (default newest first, the order without ``--sort``), ``duration``, ``epoch`` (the best epoch),
``status``, ``stage``, ``run`` (the label), ``data``, ``params.NAME`` (a param's full name or its short one,
``params.lr``; numbers compared as numbers) and ``metrics.NAME`` (the run's last logged value; better first).
``:asc`` or ``:desc`` overrides the direction. Runs without a value come last either way; ties keep newest first.
``--max-runs`` picks the newest runs first, then they are sorted.
"""

from __future__ import annotations

from typing import Any, Callable

from recipes.compare.errors import CompareError
from recipes.compare.labels import short_names
from recipes.compare.metric import lower_is_better

COLUMNS = {"best": "best", "last": "last", "start": "start", "duration": "duration (s)", "epoch": "best epoch",
           "status": "status", "stage": "stage", "run": "run", "data": "data"}
KEYS = (*COLUMNS, "params.NAME", "metrics.NAME")


def parse_sort(spec: str) -> tuple[str, bool | None]:
    """(key, descending) of ``KEY[:asc|:desc]``; descending is None for the key's own default."""
    key, _, direction = spec.partition(":")
    if direction not in ("", "asc", "desc"):
        raise CompareError(f"--sort {spec!r}: the direction after ':' must be asc or desc")
    if key not in COLUMNS and not key.startswith(("params.", "metrics.")):
        raise CompareError(f"--sort {spec!r}: unknown key; use one of {', '.join(KEYS)}, then :asc or :desc")
    return key, {"": None, "asc": False, "desc": True}[direction]


def resolve_param(name: str, runs: list[Any]) -> str:
    """The full param name ``name`` stands for (itself, or the one param whose short name it is)."""
    keys = sorted(set().union(*(r.data.params.keys() for r in runs))) if runs else []
    if name in keys:
        return name
    shorts = short_names(keys)
    matches = [k for k in keys if shorts[k] == name or k.rsplit(".", 1)[-1] == name]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise CompareError(f"--sort params.{name} is ambiguous: {', '.join(matches)}; give the full name")
    raise CompareError(f"--sort params.{name}: no listed run has a param {name!r}")


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def sort_values(key: str, rows: list[dict[str, Any]], runs: list[Any], metric: str) -> tuple[list[Any], bool]:
    """The value each row is sorted by, and whether the key sorts descending by default."""
    if key.startswith("params."):
        full = resolve_param(key[len("params."):], runs)
        values: list[Any] = [run.data.params.get(full) for run in runs]
        return values, False
    if key.startswith("metrics."):
        name = key[len("metrics."):]
        return [run.data.metrics.get(name) for run in runs], not lower_is_better(name)
    values = [row[COLUMNS[key]] for row in rows]
    if key in ("best", "last"):
        return values, not lower_is_better(metric)
    return values, key == "start"


def sorted_order(values: list[Any], descending: bool) -> list[int]:
    """Row indices in the order of ``values`` (numbers as numbers when all are), missing ones last, stable."""
    present = [i for i, v in enumerate(values) if v not in (None, "")]
    missing = [i for i, v in enumerate(values) if v in (None, "")]
    numeric = all(_number(values[i]) is not None for i in present)
    key: Callable[[int], Any] = (lambda i: _number(values[i])) if numeric else (lambda i: str(values[i]))
    return sorted(present, key=key, reverse=descending) + missing  # reverse=True keeps ties in order


def sort_table(rows: list[dict[str, Any]], runs: list[Any], spec: str | None, metric: str) -> list[int]:
    """The order of the rows for ``--sort spec`` (the listing's own order without one)."""
    if not spec:
        return list(range(len(rows)))
    key, descending = parse_sort(spec)
    values, default_descending = sort_values(key, rows, runs, metric)
    return sorted_order(values, default_descending if descending is None else descending)


__all__ = ["KEYS", "parse_sort", "resolve_param", "sort_table", "sorted_order", "sort_values"]
