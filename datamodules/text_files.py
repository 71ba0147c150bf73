"""Text records for the text data modules: reading texts (and labels) from CSV or JSONL files, with named errors."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

from datamodules.csv_reading import fields_of_any_length, not_utf8_message, shown_fields
from datamodules.file_paths import unreachable_reason

CSV_SUFFIXES = (".csv",)
JSONL_SUFFIXES = (".jsonl", ".json-lines")
_INTEGER = re.compile(r"[+-]?\d+")

Label = int | str


def check_text_file_type(path: str | Path) -> None:
    """Raise ``ValueError`` unless ``path`` has a suffix ``read_text_label_file`` reads (.csv, .jsonl, .json-lines)."""
    suffix = Path(path).suffix.lower()
    if suffix not in CSV_SUFFIXES + JSONL_SUFFIXES:
        raise ValueError(
            f"{str(path)!r}: unknown file type {Path(path).suffix!r}; use a .csv file (with a header row) or a "
            ".jsonl / .json-lines file (one JSON object per line)"
        )


def read_text_label_file(
    path: str | Path, text_field: str, label_field: str | None
) -> tuple[list[str], list[Label], list[int]]:
    """``(texts, labels, line_numbers)`` of every record of a CSV or JSONL file, read without modifying it.

    CSV (``.csv``): a header row names the fields; a label column whose values are all integers gives ``int``
    labels, otherwise the labels are the strings as written. JSONL (``.jsonl``, ``.json-lines``): one JSON object
    per line (blank lines are skipped); labels are JSON integers or strings. Texts must be non-blank strings.
    ``line_numbers`` holds the 1-based line on which each record starts. Errors name the file, the line, the
    field and the value.

    With ``label_field=None`` (new data to predict) only the texts are read: a label field may be absent and is
    ignored if present, and ``labels`` is empty.
    """
    path = Path(path)
    check_text_file_type(path)
    problem = unreachable_reason(path)
    if problem is not None:
        raise FileNotFoundError(problem)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a file")
    fields = [text_field] if label_field is None else [text_field, label_field]
    try:
        if path.suffix.lower() in CSV_SUFFIXES:
            records = _read_csv(path, fields)
        else:
            records = _read_jsonl(path, fields)
    except UnicodeDecodeError as err:
        raise ValueError(not_utf8_message(path, err)) from None
    if not records:
        raise ValueError(f"{str(path)!r} has no records")
    texts, labels, lines = [], [], []
    for line, values in records:
        text = values[0]
        if not isinstance(text, str):
            raise ValueError(
                f"{str(path)!r} line {line}: field {text_field!r} must be a string, got {text!r:.60} "
                f"({type(text).__name__})"
            )
        if not text.strip():
            raise ValueError(f"{str(path)!r} line {line}: field {text_field!r} is empty (or only whitespace)")
        texts.append(text)
        lines.append(line)
        if label_field is not None:
            labels.append(values[1])
    if label_field is None:
        return texts, [], lines
    if path.suffix.lower() in CSV_SUFFIXES and all(_INTEGER.fullmatch(label.strip()) for label in labels):
        labels = [int(label) for label in labels]
    return texts, _check_labels(path, label_field, labels, lines), lines


def _read_csv(path: Path, fields: list[str]) -> list[tuple[int, list[Any]]]:
    records = []
    # utf-8-sig: a byte-order mark (as some spreadsheet exports write) is not part of the first field name
    with path.open(encoding="utf-8-sig", newline="") as handle, fields_of_any_length():
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            raise ValueError(
                f"{str(path)!r}: the header names the field(s) {repeated} more than once; rename them so each field "
                "has its own name"
            )
        for field in fields:
            if field not in header:
                raise ValueError(
                    f"{str(path)!r}: the header has no field {field!r}; its fields are {shown_fields(header)}"
                )
        start = reader.line_num + 1
        for row in reader:
            for field in fields:
                if row.get(field) is None:
                    raise ValueError(f"{str(path)!r} line {start}: the row has no value for field {field!r}")
            records.append((start, [row[field] for field in fields]))
            start = reader.line_num + 1
    return records


def _read_jsonl(path: Path, fields: list[str]) -> list[tuple[int, list[Any]]]:
    records = []
    with path.open(encoding="utf-8-sig") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{str(path)!r} line {line_number}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(
                    f"{str(path)!r} line {line_number}: expected a JSON object, got {type(record).__name__}"
                )
            for field in fields:
                if field not in record:
                    raise ValueError(
                        f"{str(path)!r} line {line_number}: no field {field!r}; its fields are "
                        f"{shown_fields(list(record))}"
                    )
            records.append((line_number, [record[field] for field in fields]))
    return records


def _check_labels(path: Path, label_field: str, labels: list[Any], lines: list[int]) -> list[Label]:
    """Labels must be all ints or all non-empty strings."""
    for label, line in zip(labels, lines):
        if isinstance(label, bool) or not isinstance(label, (int, str)):
            raise ValueError(
                f"{str(path)!r} line {line}: label field {label_field!r} must be an integer or a string, got "
                f"{label!r:.60} ({type(label).__name__})"
            )
        if isinstance(label, str) and not label.strip():
            raise ValueError(f"{str(path)!r} line {line}: label field {label_field!r} is empty")
    kinds = [isinstance(label, int) for label in labels]
    if any(kinds) and not all(kinds):
        first_int, first_str = kinds.index(True), kinds.index(False)
        raise ValueError(
            f"{str(path)!r}: labels mix integers (e.g. {labels[first_int]!r} on line {lines[first_int]}) and strings "
            f"(e.g. {labels[first_str]!r} on line {lines[first_str]}); use one kind"
        )
    return labels
