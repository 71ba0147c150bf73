"""The encoding of a table's rows for a network: scaled numeric columns (missing values imputed, with indicators),
one-hot categorical columns, class ids.

``ColumnEncoder`` is a plain class (pandas in, tensors out, no Lightning): ``fit`` learns the numeric statistics, the
fill values and the categorical vocabularies from the rows it is given (the train split), ``transform`` encodes any
rows with them,
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

from datamodules.numeric_scaling import SCALINGS, STATEFUL_SCALERS, NumericScaler, ScalingKind, fit_scaler
from datamodules.numeric_scaling import observed_columns
from datamodules.preprocessing import Standardizer

if TYPE_CHECKING:  # pandas is imported when a table is encoded, not at start-up
    import pandas as pd

UNKNOWN = "<unknown>"
#: The slot of a missing value: a categorical block's position 1, and a numeric column's indicator (``missing:
#: impute``), named ``column=<missing>``.
MISSING_SLOT = "<missing>"
#: How missing values are treated (``missing`` of ``ColumnEncoder`` and ``TabularDataModule``).
MissingMode = Literal["impute", "error"]
MISSING_MODES: tuple[str, ...] = ("impute", "error")


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

    A row becomes its numeric columns, scaled (``scaling``) with statistics of the observed values of the rows
    ``fit`` saw (the first ``numeric_features`` positions), then, with ``missing="impute"``, one missing-indicator
    per numeric column that had a missing value in those rows (``"column=<missing>"``: 1.0 where the value was
    missing), then one one-hot block per categorical column: position 0 (``"column=<unknown>"``) stands for values
    ``fit`` did not see, position 1 (``"column=<missing>"``, ``missing="impute"`` only) for missing values, and the
    values ``fit`` saw follow in sorted order of their string form (integral numbers are written without ``.0``).
    The width is ``in_features``, the names ``feature_names``.

    Missing values (NaN, None, an empty CSV field): with ``missing="impute"`` a missing number is replaced by the
    median of that column's observed values in the rows ``fit`` saw, also in a column that had none there (which has
    no indicator: the width is fixed by ``fit``), like scikit-learn's ``SimpleImputer(strategy="median",
    add_indicator=True)``; a missing category takes the ``<missing>`` slot. With ``missing="error"`` (the encoding
    before missing values were taken, and that of a saved encoding without ``missing``) a missing number is an error
    and a missing category takes the ``<unknown>`` slot. An infinite number is always an error, and so is a numeric
    column with no observed value in the rows ``fit`` saw.

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
        missing: "impute" (missing numbers take the fitted median, plus an indicator; missing categories their own
            slot) or "error" (a missing number is an error, a missing category takes the ``<unknown>`` slot). A saved
            encoding (``load_state_dict``) brings its own.
        scaling: How numeric columns are scaled: "standard" (``(x - mean) / std``), "quantile" (to a normal through
            the values' quantiles: ``QuantileScaler``) or "robust" (median and interquartile range, then smooth
            clipping to +-3: ``RobustScaler``). A saved encoding brings its own.
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
        missing: MissingMode = "impute",
        scaling: ScalingKind = "standard",
    ) -> None:
        if missing not in MISSING_MODES:
            raise ValueError(f"{owner}: missing must be one of {list(MISSING_MODES)}, got {missing!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"{owner}: scaling must be one of {list(SCALINGS)}, got {scaling!r}")
        self.target = target
        self.task = task
        self.numeric_columns = list(numeric_columns)
        self.categorical_columns = list(categorical_columns)
        self.owner = owner
        self.source = source
        self.warn = warn
        self.class_names: list[str] | None = None
        self.vocabularies: dict[str, list[str]] = {}
        self.missing: str = missing
        self.scaling: str = scaling
        self.scaler: NumericScaler = Standardizer()
        self.fill: list[float] = []  # per numeric column, the fitted median ("impute")
        self.indicators: list[str] = []  # the numeric columns with a missing-indicator, in numeric column order
        self.fitted = False

    # --- description ----------------------------------------------------------------------------------------
    def _require_fitted(self) -> None:
        """Raise ``RuntimeError`` before ``fit`` or ``load_state_dict``."""
        if not self.fitted:
            raise RuntimeError(f"{self.owner}: the encoder is not fitted; call fit() or load_state_dict() first")

    @property
    def imputes(self) -> bool:
        """Whether missing values are imputed (``missing="impute"``) rather than refused (numbers) or unknown."""
        return self.missing == "impute"

    @property
    def block_offset(self) -> int:
        """Position of a categorical block's first known value: after ``<unknown>`` (and ``<missing>``)."""
        return 2 if self.imputes else 1

    @property
    def standardizer(self) -> Standardizer | None:
        """The numeric columns' mean and std (``scaling="standard"``); ``None`` with another scaling."""
        return self.scaler if isinstance(self.scaler, Standardizer) else None

    @property
    def numeric_features(self) -> int:
        """The number of leading scaled numeric positions of an encoded row (missing-indicators not counted)."""
        self._require_fitted()
        return len(self.numeric_columns)

    @property
    def in_features(self) -> int:
        """Width of one encoded row: the numeric columns, their missing-indicators, and one block per categorical
        column (its vocabulary plus ``<unknown>``, plus ``<missing>`` with ``missing="impute"``)."""
        self._require_fitted()
        blocks = sum(len(self.vocabularies[c]) + self.block_offset for c in self.categorical_columns)
        return len(self.numeric_columns) + len(self.indicators) + blocks

    @property
    def feature_names(self) -> list[str]:
        """Name of each position: numeric columns, ``column=<missing>`` indicators, then each categorical block's
        ``column=<unknown>``, ``column=<missing>`` (``missing="impute"``) and ``column=value`` entries."""
        self._require_fitted()
        names = list(self.numeric_columns) + [f"{column}={MISSING_SLOT}" for column in self.indicators]
        for column in self.categorical_columns:
            names.append(f"{column}={UNKNOWN}")
            if self.imputes:
                names.append(f"{column}={MISSING_SLOT}")
            names.extend(f"{column}={value}" for value in self.vocabularies[column])
        return names

    # --- reading columns ------------------------------------------------------------------------------------
    def numeric_values(self, frame: "pd.DataFrame") -> Tensor:
        """The numeric columns as float64 ``(N, len(numeric_columns))``, NaN where a value is missing (``missing=
        "impute"``); errors for non-numbers, booleans and inf, and for a missing value with ``missing="error"``."""
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
            infinite = np.flatnonzero(np.isinf(values))
            if len(infinite):
                row = int(infinite[0])
                raise ValueError(
                    f"{self.owner}: numeric column {name!r} of {self.source} has the value {values[row]} at row {row} "
                    f"({len(infinite)} infinite row(s)); replace or drop those rows (a numeric column takes finite "
                    "numbers)"
                )
            missing = np.flatnonzero(np.isnan(values))
            if len(missing) and not self.imputes:
                row = int(missing[0])
                raise ValueError(
                    f"{self.owner}: numeric column {name!r} of {self.source} has a missing value (NaN) at row {row} "
                    f"({len(missing)} missing row(s)), and missing is 'error'; fill or drop those rows, or set "
                    "missing: impute (--data.init_args.missing impute) to fill them with the train median"
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
        """Learn the numeric statistics, fill values and indicators, and the categorical vocabularies from these rows
        (the train split only)."""
        self.scaler, self.fill, self.indicators = Standardizer(), [], []
        if self.numeric_columns:
            values = self.numeric_values(frame)
            missing = torch.isnan(values)
            empty = [name for j, name in enumerate(self.numeric_columns) if bool(missing[:, j].all())]
            if empty:
                raise ValueError(
                    f"{self.owner}: numeric column {empty[0]!r} of {self.source} has no value in the {len(frame)} "
                    f"rows the encoding is fitted on (the train split): every one is missing; leave it out of "
                    "features, or fill it"
                )
            self.scaler = fit_scaler(self.scaling, values)
            if self.imputes:
                self.fill = [float(np.median(column)) for column in observed_columns(values)]
                self.indicators = [name for j, name in enumerate(self.numeric_columns) if bool(missing[:, j].any())]
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
            values = self.numeric_values(frame)
            missing = torch.isnan(values)
            if self.imputes:
                values = torch.where(missing, torch.tensor(self.fill, dtype=torch.float64), values)
            parts.append(self.scaler.transform(values).float())
            if self.indicators:
                position = {name: j for j, name in enumerate(self.numeric_columns)}
                parts.append(missing[:, [position[name] for name in self.indicators]].float())
        offset = self.block_offset
        for name in self.categorical_columns:
            codes, levels = encode_names(frame[name])
            vocabulary = self.vocabularies[name]
            index = {value: i + offset for i, value in enumerate(vocabulary)}
            # level of these rows -> slot (0: unknown); the appended slot serves code -1 (missing: 1, or 0 with
            # missing="error")
            slots = [index.get(level, 0) for level in levels] + [1 if self.imputes else 0]
            table = torch.tensor(slots, dtype=torch.long)
            parts.append(F.one_hot(table[torch.from_numpy(codes)], len(vocabulary) + offset).float())
        if not parts:
            return torch.empty(len(frame), 0)
        return torch.cat(parts, dim=1)

    # --- state ----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Task, target, class names, columns, vocabularies, numeric statistics, the missing-value mode, fill
        values and indicator columns, and the scaling, in plain lists."""
        self._require_fitted()
        standard = self.standardizer
        mean, std = (None, None) if standard is None else (standard.mean, standard.std)
        scaler = {} if standard is not None else self.scaler.state_dict()  # type: ignore[union-attr]
        return {
            "task": self.task,
            "target": self.target,
            "class_names": None if self.class_names is None else list(self.class_names),
            "numeric_columns": list(self.numeric_columns),
            "categorical_columns": list(self.categorical_columns),
            "vocabularies": {name: list(self.vocabularies[name]) for name in self.categorical_columns},
            "numeric_mean": [] if mean is None else mean.double().tolist(),
            "numeric_std": [] if std is None else std.double().tolist(),
            "missing": self.missing,
            "numeric_fill": list(self.fill),
            "missing_indicators": list(self.indicators),
            "scaling": self.scaling,
            "numeric_scaler": scaler,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a saved encoding (what ``state_dict`` returned) from now on; its task and target must be this one's.

        Its missing-value mode and scaling replace this encoder's. A saved encoding without them (written before
        missing values were taken) encodes as it did: ``missing="error"``, ``scaling="standard"``."""
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
        self.missing = state_dict.get("missing", "error")
        self.scaling = state_dict.get("scaling", "standard")
        self.fill = [float(v) for v in state_dict.get("numeric_fill", [])]
        self.indicators = list(state_dict.get("missing_indicators", []))
        if self.scaling in STATEFUL_SCALERS:
            self.scaler = STATEFUL_SCALERS[self.scaling]()
            self.scaler.load_state_dict(state_dict["numeric_scaler"])
        else:
            self.scaler = Standardizer()
            if self.numeric_columns:
                self.scaler.mean = torch.tensor(state_dict["numeric_mean"], dtype=torch.float64)
                self.scaler.std = torch.tensor(state_dict["numeric_std"], dtype=torch.float64)
        self.fitted = True
