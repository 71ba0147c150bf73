"""The data column of ``recipes compare``: which runs saw the same data.

Every recipe run logs its splits as MLflow dataset inputs (``recipes/tracking/dataset_inputs.py``; read back by
``recipes.tracking.run_datasets.data_record``): a name
(``SpiralDataModule/train``), a digest of the split's content, and the split as the context tag
``mlflow.data.context``. Within one table, each split's reference digest is the one most runs have (none when two
digests tie). A run's data is then:

* ``same``: every split it used has the reference digest;
* ``differs: train,val``: the splits whose digest is not the reference (data changed, another file, other settings);
* ``-``: the run recorded no data inputs (made before loopwise logged them, or by other code).

CSV and JSON add ``data digest`` (the first 8 hex digits of a SHA-256 over the run's split digests: equal for runs
that saw the same data) and ``data inputs`` (each split's name and full digest).
"""

from __future__ import annotations

import hashlib
from collections import Counter

SHORT = 8


def reference_digests(records: list[dict[str, tuple[str, str]]]) -> dict[str, str]:
    """Per split, the digest most runs have; a split whose top digests tie has none."""
    reference: dict[str, str] = {}
    splits = sorted({split for record in records for split in record})
    for split in splits:
        counts = Counter(record[split][1] for record in records if split in record).most_common(2)
        if len(counts) == 1 or counts[0][1] > counts[1][1]:
            reference[split] = counts[0][0]
    return reference


def data_marks(records: list[dict[str, tuple[str, str]]]) -> list[str]:
    """``same``, ``differs: <splits>`` or ``-`` for each run (see the module docstring)."""
    reference = reference_digests(records)
    marks = []
    for record in records:
        differ = [split for split, (_, digest) in sorted(record.items()) if reference.get(split) != digest]
        marks.append("-" if not record else f"differs: {','.join(differ)}" if differ else "same")
    return marks


def data_digest(record: dict[str, tuple[str, str]]) -> str:
    """A short digest of all the run's splits: equal for runs that saw the same data ("" without inputs)."""
    if not record:
        return ""
    text = ";".join(f"{split}:{digest}" for split, (_, digest) in sorted(record.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:SHORT]


def data_inputs_text(record: dict[str, tuple[str, str]]) -> str:
    """Each split's name and full digest, for CSV and JSON."""
    return "; ".join(f"{name}:{digest}" for _, (name, digest) in sorted(record.items()))


def data_summary(records: list[dict[str, tuple[str, str]]]) -> str:
    """The reference data of a table in a few words: ``SpiralDataModule train 693611d8 val 7c9526c6``."""
    reference = reference_digests(records)
    if not any(records):
        return "not recorded"
    names = sorted({name.rsplit("/", 1)[0] for record in records for name, _ in record.values()})
    splits = " ".join(f"{split} {digest[:SHORT]}" for split, digest in reference.items())
    return f"{', '.join(names)}{': ' + splits if splits else ''}"


__all__ = ["data_digest", "data_inputs_text", "data_marks", "data_summary", "reference_digests"]
