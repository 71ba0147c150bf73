"""The encoding of a table's rows for a network: standardized numeric columns, one-hot categorical columns, class ids.

``ColumnEncoder`` is a plain class (pandas in, tensors out, no Lightning): ``fit`` learns the numeric statistics and
the categorical vocabularies from the rows it is given (the train split), ``transform`` encodes any rows with them,
``targets`` turns the target column into class ids or regression targets, and ``state_dict``/``load_state_dict``
carry all of it in plain lists, so a restored encoder encodes every table exactly as the fitted one did.
``TabularDataModule`` delegates its encoding to it.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from datamodules.preprocessing import Standardizer

if TYPE_CHECKING:  # pandas is imported when a table is encoded, not at start-up
    import pandas as pd

UNKNOWN = "<unknown>"


def category_name(value: Any) -> str:
    """The string a category or class label is known by: integral numbers without ``.0`` (``3.0`` -> ``"3"``)."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return str(value)


def encode_names(column: "pd.Series") -> tuple[np.ndarray, list[str]]:
    """Codes into the sorted distinct names of ``column`` (-1 for missing values) and those names."""
    import pandas as pd

    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    names = [category_name(v) for v in uniques]
    levels = sorted(set(names))
    position = {name: i for i, name in enumerate(levels)}
    remap = np.array([position[n] for n in names] + [-1], dtype=np.int64)  # code -1 picks the final -1
    return remap[codes], levels


def is_numeric_column(column: "pd.Series") -> bool:
    """Numbers (not booleans, not strings, not mixed objects): a column of ``true``/``false`` is categorical."""
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column))


def boolean_rows(column: "pd.Series") -> np.ndarray:
    """Positions of the values that are booleans (``true``/``false`` in a CSV, ``True`` in a frame)."""
    import pandas as pd

    if pd.api.types.is_bool_dtype(column):
        return np.flatnonzero(column.notna().to_numpy())
    if pd.api.types.is_numeric_dtype(column):
        return np.empty(0, dtype=np.int64)
    return np.flatnonzero(column.map(lambda v: isinstance(v, (bool, np.bool_))).to_numpy(dtype=bool))


class ColumnEncoder:
    """Encodes the rows of a table (a pandas DataFrame) as one float32 vector each, and its target column.

    A row becomes its numeric columns, standardized with the mean and (population) std of the rows ``fit`` saw,
    followed by one one-hot block per categorical column: position 0 (``"column=<unknown>"``) stands for values
    ``fit`` did not see and for missing values, the values ``fit`` saw follow in sorted order of their string form
    (integral numbers are written without ``.0``). The width is ``in_features``, the names ``feature_names``.

    Errors name the column, the row (counted from 0 in the frame given) and the value; each message starts with
    ``owner`` and calls the table ``source``.

    Args:
        target: The target column.
        task: "classification" (the target holds class labels) or "regression" (the target holds numbers).
        numeric_columns: The feature columns to standardize, in this order.
        categorical_columns: The feature columns to one-hot encode, in this order (after the numeric ones).
        owner: The name that starts every error and warning message.
        source: What the messages call the table (e.g. its file name, quoted).
        warn: Called with the text of each warning (``warnings.warn`` by default).
    """

    def __init__(
        self,
        target: str,
        task: Literal["classification", "regression"] = "classification",
        numeric_columns: Sequence[str] = (),
        categorical_columns: Sequence[str] = (),
        owner: str = "ColumnEncoder",
        source: str = "the table",
        warn: Callable[[str], Any] = warnings.warn,
    ) -> None:
        self.target = target
        self.task = task
        self.numeric_columns = list(numeric_columns)
        self.categorical_columns = list(categorical_columns)
        self.owner = owner
        self.source = source
        self.warn = warn
        self.class_names: list[str] | None = None
        self.vocabularies: dict[str, list[str]] = {}
        self.standardizer = Standardizer()
        self.fitted = False

    # --- description ----------------------------------------------------------------------------------------
    def _require_fitted(self) -> None:
        """Raise ``RuntimeError`` before ``fit`` or ``load_state_dict``."""
        if not self.fitted:
            raise RuntimeError(f"{self.owner}: the encoder is not fitted; call fit() or load_state_dict() first")

    @property
    def in_features(self) -> int:
        """Width of one encoded row: the numeric columns plus one block of (vocabulary + 1) per categorical column."""
        self._require_fitted()
        return len(self.numeric_columns) + sum(len(self.vocabularies[c]) + 1 for c in self.categorical_columns)

    @property
    def feature_names(self) -> list[str]:
        """Name of each position: numeric columns, then ``column=<unknown>`` and ``column=value`` entries."""
        self._require_fitted()
        names = list(self.numeric_columns)
        for column in self.categorical_columns:
            names.append(f"{column}={UNKNOWN}")
            names.extend(f"{column}={value}" for value in self.vocabularies[column])
        return names

    # --- reading columns ------------------------------------------------------------------------------------
    def numeric_values(self, frame: "pd.DataFrame") -> Tensor:
        """The numeric columns as float64 ``(N, len(numeric_columns))``; errors for non-numbers, NaN and inf."""
        import pandas as pd

        columns = self.numeric_columns
        out = np.empty((len(frame), len(columns)), dtype=np.float64)
        for j, name in enumerate(columns):
            column = frame[name]
            flags = boolean_rows(column)
            if len(flags):
                row = int(flags[0])
                raise ValueError(
                    f"{self.owner}: column {name!r} of {self.source} is numeric but has the boolean "
                    f"{bool(column.iloc[row])} at row {row} ({len(flags)} such row(s)); write numbers there (1/0), "
                    f"or add {name!r} to categorical when training to one-hot encode true/false"
                )
            if not pd.api.types.is_numeric_dtype(column):
                converted = pd.to_numeric(column, errors="coerce")
                bad = np.flatnonzero((converted.isna() & column.notna()).to_numpy())
                if len(bad):
                    row = int(bad[0])
                    raise ValueError(
                        f"{self.owner}: column {name!r} of {self.source} is treated as numeric but has the "
                        f"non-numeric value {column.iloc[row]!r} at row {row} ({len(bad)} such row(s)); add "
                        f"{name!r} to categorical to one-hot encode it, or fix the value"
                    )
                column = converted
            values = column.to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                row = int(bad[0])
                kind = "a missing value (NaN)" if np.isnan(values[row]) else f"the value {values[row]}"
                raise ValueError(
                    f"{self.owner}: numeric column {name!r} of {self.source} has {kind} at row {row} ({len(bad)} "
                    "non-finite row(s)); fill or drop those rows, or add the column to categorical (missing "
                    f"categories map to {UNKNOWN})"
                )
            out[:, j] = values
        return torch.from_numpy(out)

    def targets(self, frame: "pd.DataFrame") -> Tensor:
        """Class ids (int64) or regression targets (float32), shape ``(N,)``.

        Without ``class_names`` the classes are this table's distinct labels in sorted order (numbers by value,
        others by their string), which become ``class_names``; with them (restored from a checkpoint), this table's
        labels are mapped onto them and a label outside them is an error.
        """
        import pandas as pd

        column = frame[self.target]
        where = f"the target column {self.target!r} of {self.source}"
        missing = np.flatnonzero(column.isna().to_numpy())
        if len(missing):
            raise ValueError(
                f"{self.owner}: {where} has {len(missing)} missing value(s); first at row {int(missing[0])}; drop or "
                "fill those rows"
            )
        if self.task == "regression":
            values = pd.to_numeric(column, errors="coerce") if not is_numeric_column(column) else column
            bad = np.flatnonzero(values.isna().to_numpy())
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"{self.owner}: task='regression' needs a numeric target, but column {self.target!r} of "
                    f"{self.source} has {column.iloc[row]!r} at row {row}; use task='classification' for labels"
                )
            numbers = values.to_numpy(dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(numbers))
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"{self.owner}: {where} has the value {numbers[row]} at row {row}; regression targets must be "
                    "finite"
                )
            return torch.tensor(numbers, dtype=torch.float32)
        if is_numeric_column(column) and not pd.api.types.is_bool_dtype(column):
            numbers = column.to_numpy(dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(numbers) | (numbers != np.floor(numbers)))
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"{self.owner}: the classification target {self.target!r} of {self.source} has the non-integer "
                    f"value {numbers[row]} at row {row}; class labels are ints or strings: use task='regression' "
                    "to predict numbers"
                )
            distinct = np.unique(numbers)  # numeric labels sorted by value (2 before 10)
            names = [category_name(v) for v in distinct]
            ids = np.searchsorted(distinct, numbers)
        else:
            ids, names = encode_names(column)
        if self.class_names is None:
            if len(names) < 2:
                raise ValueError(
                    f"{self.owner}: {where} has only the label(s) {names}; classification needs at least 2 classes"
                )
            self.class_names = names
            return torch.as_tensor(ids, dtype=torch.long)
        position = {name: i for i, name in enumerate(self.class_names)}
        unknown = [n for n in names if n not in position]
        if unknown:
            rows = np.flatnonzero(np.isin(np.asarray(names, dtype=object)[ids], unknown))
            raise ValueError(
                f"{self.owner}: label {unknown[0]!r} at row {int(rows[0])} of {self.source} is not one of the "
                f"checkpoint's classes {self.class_names}"
            )
        remap = np.array([position[n] for n in names], dtype=np.int64)
        return torch.as_tensor(remap[ids], dtype=torch.long)

    # --- fit and transform ----------------------------------------------------------------------------------
    def fit(self, frame: "pd.DataFrame") -> ColumnEncoder:
        """Learn the numeric statistics and the categorical vocabularies from these rows (the train split only)."""
        self.standardizer = Standardizer()
        if self.numeric_columns:
            self.standardizer.fit(self.numeric_values(frame))
        self.vocabularies = {}
        for name in self.categorical_columns:
            codes, levels = encode_names(frame[name])
            self.vocabularies[name] = [levels[code] for code in np.unique(codes) if code >= 0]  # sorted, like levels
            size = len(self.vocabularies[name])
            if size > 50 and size > len(frame) // 2:
                self.warn(
                    f"{self.owner}: categorical column {name!r} of {self.source} has {size} distinct values in "
                    f"{len(frame)} train rows; it looks like an identifier, which one-hot encoding cannot generalize "
                    "from: leave it out with features"
                )
        self.fitted = True
        return self

    def transform(self, frame: "pd.DataFrame", source: str | None = None) -> Tensor:
        """The rows of ``frame`` encoded: float32 ``(N, in_features)``. Errors call the table ``source`` (e.g. the
        file being predicted), by default the encoder's own ``source``."""
        if source is not None and source != self.source:
            where = self.source
            self.source = source
            try:
                return self.transform(frame)
            finally:
                self.source = where
        self._require_fitted()
        parts = []
        if self.numeric_columns:
            parts.append(self.standardizer.transform(self.numeric_values(frame)).float())
        for name in self.categorical_columns:
            codes, levels = encode_names(frame[name])
            vocabulary = self.vocabularies[name]
            index = {value: i + 1 for i, value in enumerate(vocabulary)}
            # level of these rows -> vocabulary id (0: unknown); the appended 0 serves code -1 (missing value)
            table = torch.tensor([index.get(level, 0) for level in levels] + [0], dtype=torch.long)
            parts.append(F.one_hot(table[torch.from_numpy(codes)], len(vocabulary) + 1).float())
        return torch.cat(parts, dim=1)

    # --- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Task, target, class names, columns, vocabularies and numeric statistics, in plain lists."""
        self._require_fitted()
        mean, std = self.standardizer.mean, self.standardizer.std
        return {
            "task": self.task,
            "target": self.target,
            "class_names": None if self.class_names is None else list(self.class_names),
            "numeric_columns": list(self.numeric_columns),
            "categorical_columns": list(self.categorical_columns),
            "vocabularies": {name: list(self.vocabularies[name]) for name in self.categorical_columns},
            "numeric_mean": [] if mean is None else mean.double().tolist(),
            "numeric_std": [] if std is None else std.double().tolist(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a saved encoding (what ``state_dict`` returned) from now on; its task and target must be this one's."""
        for key in ("task", "target"):
            if state_dict[key] != getattr(self, key):
                raise ValueError(
                    f"{self.owner}: the saved encoding has {key}={state_dict[key]!r} but this one has "
                    f"{key}={getattr(self, key)!r}"
                )
        self.class_names = None if state_dict["class_names"] is None else list(state_dict["class_names"])
        self.numeric_columns = list(state_dict["numeric_columns"])
        self.categorical_columns = list(state_dict["categorical_columns"])
        self.vocabularies = {name: list(values) for name, values in state_dict["vocabularies"].items()}
        self.standardizer = Standardizer()
        if self.numeric_columns:
            self.standardizer.mean = torch.tensor(state_dict["numeric_mean"], dtype=torch.float64)
            self.standardizer.std = torch.tensor(state_dict["numeric_std"], dtype=torch.float64)
        self.fitted = True
