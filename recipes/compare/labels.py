"""Run labels: what differs between the listed runs, said in a few words (``lr=0.003 batch_size=32``).

* The params that differ: those whose values are not the same in every listed run (a missing param counts as a
  value, shown ``(none)``).
* Left out of the label (but kept in CSV/JSON): params that follow from the others (``DERIVED``: the training
  plan's ``plan.*`` arithmetic, ``effective_batch_size``, ``total_optimizer_steps``), unless nothing else differs;
  and a param whose values repeat, run for run, those of a param already in the label: one setting logged under a
  long and a short name (``model.init_args.optimizer.init_args.lr`` or ``sweep.optimizer.lr`` beside ``lr``) is
  named once, under the name with the fewest dotted parts (``lr=0.001``). Values are compared as the label would
  read them, numbers as numbers (``1e-3`` repeats ``0.001``), so the spelling of a value does not make it a second
  setting.
* Names are shortened to their last dotted component (``init_args`` left out), or as many trailing components as
  it takes to tell them apart (``schedule.warmup_steps`` stays long beside ``plan.warmup_steps``).
* Runs of one stage whose params are all equal get ``data=<digest>`` added when each saw other data (the data
  digest of ``compare_data``), else their id's first 8 characters; with no differing param the label is the run's
  MLflow name. The same label is the run's line in ``--plot`` (``wrap_label``: wrapped at spaces, never mid-word).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any

DERIVED_PREFIXES = ("plan.",)
DERIVED = frozenset({"effective_batch_size", "total_optimizer_steps"})
MISSING = "(none)"
MAX_VALUE = 24
LABEL_WIDTH = 36  # a plot legend's line, in characters


def differing_params(runs: list[Any]) -> list[str]:
    """Param names whose values are not the same in every run (sorted)."""
    keys = sorted(set().union(*(r.data.params.keys() for r in runs))) if runs else []
    return [k for k in keys if len({r.data.params.get(k) for r in runs}) > 1]


def is_derived(key: str) -> bool:
    """True for params that follow from others (the training plan's arithmetic)."""
    return key in DERIVED or key.startswith(DERIVED_PREFIXES)


def _preference(key: str) -> tuple[int, int, str]:
    return (key.count("."), len(key), key)


def same_setting(value: str | None) -> Any:
    """A param value as the label reads it, for telling repeats apart: numbers as numbers (``1e-3`` is ``0.001``,
    to the label's 6 significant digits), ``true``/``True`` alike, other text without spaces."""
    if value is None:
        return None
    text = "".join(str(value).split())
    try:
        number = float(text)
    except ValueError:
        return text.lower() if text.lower() in ("true", "false", "none", "null") else text
    return float(f"{number:.6g}") if math.isfinite(number) else text.lower()


def label_params(runs: list[Any], params: list[str]) -> list[str]:
    """The differing params a label names: no derived ones (unless only those differ), no repeated columns (a param
    whose values equal, run for run, those of one with fewer dotted parts: ``optimizer.lr`` beside ``lr``)."""
    chosen = [k for k in params if not is_derived(k)] or list(params)
    kept: list[str] = []
    seen: set[tuple[Any, ...]] = set()
    for key in sorted(chosen, key=_preference):
        values = tuple(same_setting(r.data.params.get(key)) for r in runs)
        if values not in seen:
            seen.add(values)
            kept.append(key)
    names = short_names(kept)
    return sorted(kept, key=lambda k: (names[k], k))


def short_names(keys: list[str]) -> dict[str, str]:
    """Each key's shortest unambiguous dotted suffix, ``init_args`` left out (``model.init_args.lr`` -> ``lr``)."""
    parts = {key: [p for p in key.split(".") if p != "init_args"] or [key] for key in keys}
    names: dict[str, str] = {}
    for key in keys:
        for n in range(1, len(parts[key]) + 1):
            candidate = ".".join(parts[key][-n:])
            if all(".".join(parts[other][-n:]) != candidate for other in keys if other != key):
                names[key] = candidate
                break
        else:
            names[key] = key
    if len(set(names.values())) < len(names):  # e.g. a.init_args.b beside a.b: keep the full names
        names = {key: key for key in keys}
    return names


def short_value(value: str | None) -> str:
    """A param value for a label: no spaces, numbers to 6 significant digits, at most ``MAX_VALUE`` characters."""
    if value is None:
        return MISSING
    text = "".join(str(value).split())
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and len(f"{number:.6g}") < len(text):  # 0.15000000000000002 -> 0.15
        text = f"{number:.6g}"
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 1] + "…"


def wrap_label(label: str, width: int = LABEL_WIDTH) -> str:
    """``label`` on lines of at most ``width`` characters, broken at spaces only (a longer word keeps its line)."""
    lines = textwrap.wrap(label, width, break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines) or label


def run_labels(runs: list[Any], stages: list[str], data: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(one label per run, the params the labels name); ``stages[i]`` is run i's stage, ``data[i]`` its data digest.

    Runs of one stage whose labels are equal get ``data=<digest>`` added where their data differ, else their id's
    first 8 characters.
    """
    params = label_params(runs, differing_params(runs))
    names = short_names(params)
    labels = [" ".join(f"{names[k]}={short_value(r.data.params.get(k))}" for k in params) for r in runs]
    labels = [label or (r.info.run_name or r.info.run_id[:8]) for label, r in zip(labels, runs)]
    counts: dict[tuple[str, str], int] = {}
    for label, stage in zip(labels, stages):
        counts[(label, stage)] = counts.get((label, stage), 0) + 1
    data = data or [""] * len(runs)
    digests: dict[tuple[str, str], set[str]] = {}
    for label, stage, digest in zip(labels, stages, data):
        digests.setdefault((label, stage), set()).add(digest)
    labels = [
        label if counts[(label, stage)] == 1
        else f"{label} data={digest}" if digest and len(digests[(label, stage)]) == counts[(label, stage)]
        else f"{label} {r.info.run_id[:8]}"
        for label, stage, digest, r in zip(labels, stages, data, runs)
    ]
    return labels, params


__all__ = ["DERIVED", "LABEL_WIDTH", "differing_params", "is_derived", "label_params", "run_labels", "same_setting",
           "short_names", "short_value", "wrap_label"]
