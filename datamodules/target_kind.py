"""Whether a table's target column fits the task, checked when the file is first read (before any training).

A classification task on a target of plain numbers (a measurement such as scikit-learn's diabetes ``progression``)
would silently train one class per distinct value; a regression task on labels (text, ``true``/``false``) cannot
train at all. ``target_kind_error`` says which, in one line naming the column, its number of distinct values and the
fix; the data module raises it as ``TargetKindError``.

The rule for a classification target of integral numbers (non-integers are refused by the encoder, naming the row):
more than ``MANY_CLASSES`` (50) distinct values, or at least ``MIN_CLASSES_FOR_UNIQUE_RULE`` (10) distinct values of
which more than half occur in one row only. Both hold for measurements and counts, rarely for class labels; a real
many-class problem passes with the data module's ``many_classes=True``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from datamodules.column_encoding import is_numeric_column

if TYPE_CHECKING:  # pandas is imported when a table is read, not at start-up
    import pandas as pd

MANY_CLASSES = 50
MIN_CLASSES_FOR_UNIQUE_RULE = 10


class TargetKindError(ValueError):
    """The target column holds another kind of values than the task needs (numbers for a classifier, labels for a
    regression). A ``ValueError``: the recipes print it as one ``recipes: error:`` line before any run is made."""


def target_kind_error(
    column: "pd.Series", target: str, task: str, source: str, owner: str, many_classes: bool = False
) -> str | None:
    """Why ``column`` (the target ``target`` of the table ``source``) does not fit ``task``, or ``None``.

    Args:
        column: The target column, as read.
        target: Its name.
        task: "classification" or "regression".
        source: What the message calls the table (e.g. its file name, quoted).
        owner: The name that starts the message (the data module's class).
        many_classes: A classification target with many distinct integral values is accepted (a real many-class
            problem).
    """
    import pandas as pd

    present = column[column.notna()]
    if task == "regression":
        if pd.api.types.is_bool_dtype(column):
            labels = True
            numbers = pd.Series(np.nan, index=present.index)
        elif is_numeric_column(column):
            return None
        else:
            numbers = pd.to_numeric(present, errors="coerce")
            labels = bool(numbers.isna().any())
        if not labels:
            return None
        row = int(np.flatnonzero(numbers.isna().to_numpy())[0])
        value = present.iloc[row]
        value = value.item() if isinstance(value, np.generic) else value  # True, not np.True_
        return (
            f"{owner}: task='regression' needs a numeric target, but column {target!r} of {source} has "
            f"{value!r} at row {int(present.index[row])} ({present.nunique()} distinct values: class "
            "labels); use task: classification (the tabular classification recipe configs/tabular_mlp.yaml)"
        )
    if many_classes or not is_numeric_column(column) or not len(present):
        return None
    numbers = present.to_numpy(dtype=np.float64)
    if not np.all(np.isfinite(numbers) & (numbers == np.floor(numbers))):
        return None  # the encoder names the non-integer value and its row
    counts = pd.Series(numbers).value_counts()
    distinct, once = len(counts), int((counts == 1).sum())
    if distinct > MANY_CLASSES:
        why = f"more than {MANY_CLASSES}"
    elif distinct >= MIN_CLASSES_FOR_UNIQUE_RULE and once > distinct / 2:
        why = f"{once} of them in one row only"
    else:
        return None
    return (
        f"{owner}: the classification target {target!r} of {source} holds numbers with {distinct} distinct values "
        f"({why}): it looks like a quantity to predict, not class labels; use task: regression (the regression "
        f"recipe configs/regression_mlp.yaml), or set many_classes: true for a real {distinct}-class problem"
    )
