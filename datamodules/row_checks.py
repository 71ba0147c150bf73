"""What raw rows to predict hold that a fitted ``ColumnEncoder`` cannot encode, or encodes with its ``<unknown>`` slot.

The MLflow model of a run refuses a request that holds a value no numeric column takes and names every such value
(``bad_numbers``), rather than the first one that ``ColumnEncoder.transform`` meets (a missing number is one only
when the encoder does not impute: ``missing="error"``); a category the encoder did not see (or, with
``missing="error"``, a missing one) is predicted with the column's ``<unknown>`` slot, as in training, and each row's
such values are listed (``unknown_categories``) for the predictions to say so. Plain functions of the encoder and a pandas
DataFrame whose rows are counted from 0 (its index is not read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from datamodules.column_encoding import UNKNOWN, ColumnEncoder, boolean_rows, category_name, encode_names

if TYPE_CHECKING:  # pandas is imported when a table is checked, not at start-up
    import pandas as pd

#: The predictions' column that names each row's values predicted with the ``<unknown>`` slot.
UNKNOWN_COLUMN = "unknown_categories"
#: A missing categorical value as ``unknown_categories`` writes it.
MISSING = "<missing>"
#: At most this many bad values are named one by one in a refusal; the others are counted.
NAMED_AT_MOST = 100


def bad_numbers(encoder: ColumnEncoder, frame: "pd.DataFrame") -> list[tuple[int, str, str]]:
    """Every value of ``encoder``'s numeric columns in ``frame`` that is not a finite number, as (row, column, what
    is wrong), in row order then column order. A boolean is not a number (``true`` is not 1), a missing value is
    refused only when the encoder does not impute (``missing="error"``; otherwise it takes the fitted median), a
    number written as text (``"12"``) is read as the number, as when a file is read. A column ``frame`` lacks is
    skipped."""
    import pandas as pd

    found = []
    for name in encoder.numeric_columns:
        if name not in frame.columns:
            continue
        column = frame[name].reset_index(drop=True).astype(object)
        flags = boolean_rows(column)
        values = column.copy()
        values.iloc[flags] = None  # pandas reads True as 1
        numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        for row in np.flatnonzero(~np.isfinite(numbers)):
            value = column.iloc[row]
            if isinstance(value, (bool, np.bool_)):
                what = f"{str(bool(value)).lower()} is not a number"
            elif pd.api.types.is_scalar(value) and pd.isna(value):
                if encoder.imputes:
                    continue  # imputed with the train median
                what = "a missing value (null/NaN), which a numeric column of a model trained with missing: error "\
                    "does not take"
            elif np.isnan(numbers[row]):
                what = f"{value!r} is not a number"
            else:
                what = f"{numbers[row]} is not a finite number"
            found.append((int(row), name, what))
    order = {name: i for i, name in enumerate(encoder.numeric_columns)}
    return sorted(found, key=lambda cell: (cell[0], order[cell[1]]))


def bad_numbers_message(owner: str, cells: list[tuple[int, str, str]]) -> str:
    """One line naming every bad value of ``bad_numbers`` (the first ``NAMED_AT_MOST``, then a count of the others)
    and the fix; nothing of the rows was predicted."""
    named = "; ".join(f"row {row}, column {name!r}: {what}" for row, name, what in cells[:NAMED_AT_MOST])
    more = f"; and {len(cells) - NAMED_AT_MOST} more" if len(cells) > NAMED_AT_MOST else ""
    rows = len({row for row, _, _ in cells})
    return (
        f"{owner}: {len(cells)} value(s) in {rows} row(s) are not numbers a numeric column takes: {named}{more}; "
        "fill or drop those rows (numeric columns take finite numbers only; no row was predicted)"
    )


def unknown_categories(encoder: ColumnEncoder, frame: "pd.DataFrame") -> list[str]:
    """For each row of ``frame``, its categorical values that ``encoder`` encodes with the column's ``<unknown>``
    slot: ``column='value'`` for a value the train split did not have, ``column=<missing>`` for a missing one when
    the encoder does not impute (``missing="error"``; otherwise a missing value has a slot of its own and is not
    listed), joined by ``"; "`` in column order (``""``: none). A column ``frame`` lacks is skipped."""
    notes: list[list[str]] = [[] for _ in range(len(frame))]
    for name in encoder.categorical_columns:
        if name not in frame.columns:
            continue
        column = frame[name].reset_index(drop=True)
        codes, levels = encode_names(column)
        known = set(encoder.vocabularies[name])
        missing_is_unknown = not encoder.imputes
        unknown = np.array([level not in known for level in levels] + [missing_is_unknown], dtype=bool)  # -1: missing
        for row in np.flatnonzero(unknown[codes]):
            shown = MISSING if codes[row] < 0 else repr(category_name(column.iloc[row]))
            notes[row].append(f"{name}={shown}")
    return ["; ".join(row) for row in notes]


def unknown_categories_warning(owner: str, notes: list[str], source: str) -> str | None:
    """The one warning line of ``recipes predict`` when rows of ``source`` hold values of ``unknown_categories``
    (``notes``), else ``None``."""
    rows = [i for i, note in enumerate(notes) if note]
    if not rows:
        return None
    first = notes[rows[0]].split("; ")[0]
    missing = " or a missing one" if any(f"={MISSING}" in note for note in notes) else ""
    return (
        f"{owner}: {len(rows)} of {len(notes)} row(s) of {source} have a category the model was not trained on"
        f"{missing}, predicted with the column's {UNKNOWN} slot (first: row {rows[0]}, {first}); the predictions "
        f"name them in the column {UNKNOWN_COLUMN}"
    )


__all__ = [
    "MISSING", "NAMED_AT_MOST", "UNKNOWN_COLUMN", "bad_numbers", "bad_numbers_message", "unknown_categories",
    "unknown_categories_warning",
]
