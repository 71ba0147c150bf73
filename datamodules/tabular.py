"""A table from a CSV or Parquet file: standardized numeric columns and one-hot categorical columns, in memory."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from datamodules.base import BaseDataModule
from datamodules.preprocessing import Standardizer

if TYPE_CHECKING:  # pandas is imported when a file is read, not at start-up
    import pandas as pd

FORMATS = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}
UNKNOWN = "<unknown>"
NAME = "TabularDataModule"


def table_format(path: str | Path) -> str:
    """``"CSV"`` or ``"Parquet"`` from the file's suffix (.csv, .parquet, .pq); a ValueError for anything else."""
    kind = FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        raise ValueError(
            f"{NAME}: cannot tell the format of {str(path)!r} from its suffix {Path(path).suffix!r}: use a .csv, "
            ".parquet or .pq file"
        )
    return kind


def read_table(path: str | Path) -> "pd.DataFrame":
    """The whole file as a DataFrame with string column names; clear errors for missing, unreadable, empty files."""
    kind = table_format(path)
    file = Path(path).expanduser()
    if not file.exists():
        raise FileNotFoundError(f"{NAME}: the data file {str(path)!r} does not exist (resolved: {file.resolve()})")
    if not file.is_file():
        raise ValueError(f"{NAME}: {str(path)!r} is not a file")
    import pandas as pd

    try:
        if kind == "CSV":
            # floats must parse exactly as written, so a CSV and a Parquet copy give identical tensors: pandas 3
            # does by default (and deprecates the option), pandas 2 needs round_trip
            exact = {"float_precision": "round_trip"} if int(pd.__version__.split(".")[0]) < 3 else {}
            frame = pd.read_csv(file, **exact)
        else:
            frame = pd.read_parquet(file)
    except ImportError:
        raise
    except pd.errors.EmptyDataError as err:
        raise ValueError(f"{NAME}: the data file {str(path)!r} is empty (no header, no rows)") from err
    except Exception as err:  # parser, encoding and Arrow errors all mean the same thing to the user
        raise ValueError(f"{NAME}: cannot read {str(path)!r} as {kind}: {type(err).__name__}: {err}") from err
    if len(frame.columns) == 0 or len(frame) == 0:
        raise ValueError(f"{NAME}: the data file {str(path)!r} has no data rows (columns: {list(frame.columns)})")
    frame.columns = [str(c) for c in frame.columns]
    return frame.reset_index(drop=True)  # rows are positions (a Parquet file may restore a stored index)


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
    """Numbers or booleans (not strings, not mixed objects)."""
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column))


class TabularDataModule(BaseDataModule):
    """Rows of a CSV or Parquet file as one float tensor per row, for classification or regression.

    The file is read in ``setup`` (with pandas) and held in memory; it is never modified. Feature columns are numeric or
    categorical. Numeric columns are standardized with the train split's mean and (population) std; categorical
    columns become one-hot blocks appended after the numeric columns, so a sample is one float32 vector of width
    ``in_features`` (names in ``feature_names``) that an MLP takes as it is.

    Categorical vocabularies come from the train split only: in each column's block, position 0
    (``"column=<unknown>"``) stands for values not seen in the train split and for missing values; the known values
    follow in sorted order of their string form (integral numbers are written without ``.0``).

    Classification: the labels (ints or strings) become class ids 0..C-1 in sorted order of the distinct labels of
    the whole file (numeric labels sorted by value, others by their string), named in ``class_names``; the split is
    stratified. Regression: the targets are raw float32 values of shape ``(N,)`` (not standardized) and the split is
    not stratified. Class names, vocabularies and numeric statistics are this module's ``state_dict``, which
    Lightning stores in every checkpoint; restoring it makes the module encode any file as the checkpoint's model
    expects.

    Bad input fails when the module is built or in ``setup`` (before any training) with a message naming the file,
    column, row and value; rows count data rows from 0 (a CSV header is not a row).

    The other arguments (``batch_size``, ``val_fraction``, ``test_fraction``, ``seed``, the loader options) are
    ``BaseDataModule``'s, passed on through ``**kwargs``; ``stratify`` follows ``task``.

    Args:
        path: The data file: ``.csv``, or ``.parquet``/``.pq``.
        target: The column to predict.
        features: The columns to use as inputs, in this order; default: every column except the target.
        categorical: The feature columns to one-hot encode; every other feature must hold numbers only. Default:
            the feature columns that are not numeric (strings, mixed values).
        task: "classification" (the target holds class labels) or "regression" (the target holds numbers).
        class_balance: Draw training samples with inverse class-frequency weights (ClassBalancedSampler), so every
            class is seen equally often (draws seeded by ``seed``); classification only. Validation and test keep
            the true distribution.
    """

    save_init_arguments = True
    fixed_arguments = ("stratify",)

    def __init__(
        self,
        path: str,
        target: str,
        features: list[str] | None = None,
        categorical: list[str] | None = None,
        task: Literal["classification", "regression"] = "classification",
        class_balance: bool = False,
        **kwargs: Any,
    ) -> None:
        if task not in ("classification", "regression"):
            raise ValueError(f"{NAME}: task must be 'classification' or 'regression', got {task!r}")
        if class_balance and task == "regression":
            raise ValueError(
                f"{NAME}: class_balance=True needs class labels, but task='regression'; set class_balance=False"
            )
        if features is not None:
            features = list(features)
            if not features:
                raise ValueError(f"{NAME}: features is an empty list; leave it unset to use every other column")
            duplicates = sorted({f for f in features if features.count(f) > 1})
            if duplicates:
                raise ValueError(f"{NAME}: features lists {duplicates} more than once")
            if target in features:
                raise ValueError(f"{NAME}: the target column {target!r} is also listed in features; remove it")
        if categorical is not None:
            categorical = list(categorical)
            if target in categorical:
                raise ValueError(f"{NAME}: the target column {target!r} is listed in categorical; remove it")
            if features is not None:
                stray = [c for c in categorical if c not in features]
                if stray:
                    raise ValueError(f"{NAME}: categorical lists {stray}, which are not in features {features}")
        table_format(path)
        if not Path(path).expanduser().exists():
            raise FileNotFoundError(f"{NAME}: the data file {path!r} does not exist (resolved: {Path(path).resolve()})")
        super().__init__(stratify=task == "classification", **kwargs)
        self.path = path
        self.target = target
        self.features = features
        self.categorical = categorical
        self.task = task
        self.class_balance = class_balance
        # the encoding: fitted in setup, or restored from a checkpoint with load_state_dict
        self.numeric_columns: list[str] = []
        self.categorical_columns: list[str] = []
        self.vocabularies: dict[str, list[str]] = {}
        self.standardizer = Standardizer()
        self._class_names: list[str] | None = None
        self._levels: dict[str, list[str]] = {}  # every distinct value of each categorical column in the file
        self._fitted = False
        self._restored: dict[str, Any] | None = None

    # --- description ----------------------------------------------------------------------------------------
    def _ensure_fitted(self) -> None:
        if not self._fitted:
            self.setup()

    @property
    def class_names(self) -> list[str] | None:
        """Name of each class id (the file's sorted labels); ``None`` for regression. Reads the file if needed."""
        if self.task == "regression":
            return None
        if self._class_names is None:
            self.setup()
        return self._class_names

    @property
    def num_classes(self) -> int | None:
        """Number of classes (distinct labels in the file); ``None`` for regression."""
        names = self.class_names
        return None if names is None else len(names)

    @property
    def out_features(self) -> int:
        """Output width the network needs: ``num_classes`` for classification, 1 for regression."""
        return 1 if self.task == "regression" else int(self.num_classes or 0)

    @property
    def in_features(self) -> int:
        """Width of one sample: the numeric columns plus one block of (vocabulary + 1) per categorical column."""
        self._ensure_fitted()
        return len(self.numeric_columns) + sum(len(self.vocabularies[c]) + 1 for c in self.categorical_columns)

    @property
    def feature_names(self) -> list[str]:
        """Name of each input position: numeric columns, then ``column=<unknown>`` and ``column=value`` entries."""
        self._ensure_fitted()
        names = list(self.numeric_columns)
        for column in self.categorical_columns:
            names.append(f"{column}={UNKNOWN}")
            names.extend(f"{column}={value}" for value in self.vocabularies[column])
        return names

    # --- reading and checking the file --------------------------------------------------------------------
    def _where(self) -> str:
        return f"{self.path!r}"

    def _resolve_columns(self, frame: "pd.DataFrame") -> tuple[list[str], list[str]]:
        """The numeric and the categorical feature columns, checked against the file."""
        available = list(frame.columns)
        if self.target not in available:
            raise ValueError(
                f"{NAME}: the target column {self.target!r} is not in {self._where()}; available columns: {available}"
            )
        if self._restored is not None:
            numeric, categorical = list(self.numeric_columns), list(self.categorical_columns)
            missing = [c for c in numeric + categorical if c not in available]
            if missing:
                raise ValueError(
                    f"{NAME}: the checkpoint's model was trained on columns {missing}, which are not in "
                    f"{self._where()}; available columns: {available}"
                )
            return numeric, categorical
        features = self.features if self.features is not None else [c for c in available if c != self.target]
        missing = [c for c in features if c not in available]
        if missing:
            raise ValueError(
                f"{NAME}: feature column(s) {missing} are not in {self._where()}; available columns: {available}"
            )
        if not features:
            raise ValueError(f"{NAME}: {self._where()} has no columns besides the target {self.target!r}")
        if self.categorical is None:
            categorical = [c for c in features if not is_numeric_column(frame[c])]
            for column in categorical:
                self._warn_if_mostly_numbers(frame[column], column)
        else:
            stray = [c for c in self.categorical if c not in features]
            if stray:
                raise ValueError(
                    f"{NAME}: categorical lists {stray}, which are not feature columns of {self._where()}; "
                    f"feature columns: {features}"
                )
            chosen = set(self.categorical)
            categorical = [c for c in features if c in chosen]
        numeric = [c for c in features if c not in set(categorical)]
        return numeric, categorical

    def _warn_if_mostly_numbers(self, column: "pd.Series", name: str) -> None:
        """Warn when a column taken as categorical holds mostly numbers: likely a numeric column with a typo."""
        import pandas as pd

        present = column[column.notna()]
        numbers = pd.to_numeric(present, errors="coerce")
        if not len(present) or numbers.notna().mean() < 0.5:
            return
        text = np.flatnonzero(numbers.isna().to_numpy())
        example = (
            f"also {present.iloc[int(text[0])]!r} (row {int(present.index[int(text[0])])})"
            if len(text)
            else "stored as text"
        )
        rank_zero_warn(
            f"{NAME}: column {name!r} of {self._where()} holds mostly numbers but {example}, so it is treated as "
            f"categorical; fix the values, or pass categorical explicitly (without {name!r}) to treat it as numeric"
        )

    def _numeric_values(self, frame: "pd.DataFrame", columns: list[str]) -> Tensor:
        """The numeric feature columns as float64 ``(N, len(columns))``; errors for non-numbers, NaN and inf."""
        import pandas as pd

        out = np.empty((len(frame), len(columns)), dtype=np.float64)
        for j, name in enumerate(columns):
            column = frame[name]
            if pd.api.types.is_bool_dtype(column):
                column = column.astype("float64")
            elif not pd.api.types.is_numeric_dtype(column):
                converted = pd.to_numeric(column, errors="coerce")
                bad = np.flatnonzero((converted.isna() & column.notna()).to_numpy())
                if len(bad):
                    row = int(bad[0])
                    raise ValueError(
                        f"{NAME}: column {name!r} of {self._where()} is treated as numeric but has the non-numeric "
                        f"value {column.iloc[row]!r} at row {row} ({len(bad)} such row(s)); add {name!r} to "
                        "categorical to one-hot encode it, or fix the value"
                    )
                column = converted
            values = column.to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                row = int(bad[0])
                kind = "a missing value (NaN)" if np.isnan(values[row]) else f"the value {values[row]}"
                raise ValueError(
                    f"{NAME}: numeric column {name!r} of {self._where()} has {kind} at row {row} ({len(bad)} "
                    "non-finite row(s)); fill or drop those rows, or add the column to categorical (missing "
                    f"categories map to {UNKNOWN})"
                )
            out[:, j] = values
        return torch.from_numpy(out)

    def _targets(self, frame: "pd.DataFrame") -> Tensor:
        """Class ids (int64) or regression targets (float32), shape ``(N,)``."""
        import pandas as pd

        column = frame[self.target]
        missing = np.flatnonzero(column.isna().to_numpy())
        if len(missing):
            raise ValueError(
                f"{NAME}: the target column {self.target!r} of {self._where()} has {len(missing)} missing value(s); "
                f"first at row {int(missing[0])}; drop or fill those rows"
            )
        if self.task == "regression":
            values = pd.to_numeric(column, errors="coerce") if not is_numeric_column(column) else column
            bad = np.flatnonzero(values.isna().to_numpy())
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"{NAME}: task='regression' needs a numeric target, but column {self.target!r} of "
                    f"{self._where()} has {column.iloc[row]!r} at row {row}; use task='classification' for labels"
                )
            numbers = values.to_numpy(dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(numbers))
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"{NAME}: the target column {self.target!r} of {self._where()} has the value {numbers[row]} at "
                    f"row {row}; regression targets must be finite"
                )
            return torch.tensor(numbers, dtype=torch.float32)
        if is_numeric_column(column) and not pd.api.types.is_bool_dtype(column):
            numbers = column.to_numpy(dtype=np.float64)
            bad = np.flatnonzero(~np.isfinite(numbers) | (numbers != np.floor(numbers)))
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"{NAME}: the classification target {self.target!r} of {self._where()} has the non-integer "
                    f"value {numbers[row]} at row {row}; class labels are ints or strings: use task='regression' "
                    "to predict numbers"
                )
            distinct = np.unique(numbers)  # numeric labels sorted by value (2 before 10)
            names = [category_name(v) for v in distinct]
            ids = np.searchsorted(distinct, numbers)
        else:
            ids, names = encode_names(column)
        if self._class_names is None:
            if len(names) < 2:
                raise ValueError(
                    f"{NAME}: the target column {self.target!r} of {self._where()} has only the label(s) {names}; "
                    "classification needs at least 2 classes"
                )
            self._class_names = names
            return torch.as_tensor(ids, dtype=torch.long)
        # class names restored from a checkpoint: map this file's labels onto them
        position = {name: i for i, name in enumerate(self._class_names)}
        unknown = [n for n in names if n not in position]
        if unknown:
            rows = np.flatnonzero(np.isin(np.asarray(names, dtype=object)[ids], unknown))
            raise ValueError(
                f"{NAME}: label {unknown[0]!r} at row {int(rows[0])} of {self._where()} is not one of the "
                f"checkpoint's classes {self._class_names}"
            )
        remap = np.array([position[n] for n in names], dtype=np.int64)
        return torch.as_tensor(remap[ids], dtype=torch.long)

    # --- the BaseDataModule hooks ---------------------------------------------------------------------------
    def load(self) -> tuple[Tensor, Tensor]:
        """The numeric columns (float64) followed by one code column per categorical column (-1 for missing)."""
        frame = read_table(self.path)
        if self._restored is None:
            self._class_names = None  # from this file's labels, also when an earlier setup failed half-way
        self.numeric_columns, self.categorical_columns = self._resolve_columns(frame)
        targets = self._targets(frame)
        numeric = self._numeric_values(frame, self.numeric_columns)
        codes = []
        self._levels = {}
        for name in self.categorical_columns:
            column_codes, self._levels[name] = encode_names(frame[name])
            codes.append(torch.from_numpy(column_codes).double().unsqueeze(1))
        return torch.cat([numeric, *codes], dim=1), targets

    def fit_preprocessing(self, train_inputs: Tensor) -> None:
        if self._restored is not None:  # the checkpoint's encoding, not a new one
            self._fitted = True
            return
        n_numeric = len(self.numeric_columns)
        self.standardizer = Standardizer()
        if n_numeric:
            self.standardizer.fit(train_inputs[:, :n_numeric])
        self.vocabularies = {}
        n_train = len(train_inputs)
        for j, name in enumerate(self.categorical_columns):
            present = torch.unique(train_inputs[:, n_numeric + j].long()).tolist()
            levels = self._levels[name]
            self.vocabularies[name] = [levels[code] for code in present if code >= 0]  # sorted, like the levels
            size = len(self.vocabularies[name])
            if size > 50 and size > n_train // 2:
                rank_zero_warn(
                    f"{NAME}: categorical column {name!r} of {self._where()} has {size} distinct values in "
                    f"{n_train} train rows; it looks like an identifier, which one-hot encoding cannot generalize "
                    "from: leave it out with features"
                )
        self._fitted = True

    def preprocess(self, inputs: Tensor) -> Tensor:
        n_numeric = len(self.numeric_columns)
        parts = []
        if n_numeric:
            parts.append(self.standardizer.transform(inputs[:, :n_numeric]).float())
        for j, name in enumerate(self.categorical_columns):
            vocabulary = self.vocabularies[name]
            index = {value: i + 1 for i, value in enumerate(vocabulary)}
            # file level -> vocabulary id (0: unknown); the appended 0 serves code -1 (missing value)
            table = torch.tensor([index.get(level, 0) for level in self._levels[name]] + [0], dtype=torch.long)
            ids = table[inputs[:, n_numeric + j].long()]
            parts.append(F.one_hot(ids, len(vocabulary) + 1).float())
        return torch.cat(parts, dim=1)

    def train_sampler(self, dataset: Dataset) -> Sampler | None:
        """``ClassBalancedSampler`` over the train labels with ``class_balance``; seeded shuffling otherwise."""
        if not self.class_balance:
            return None
        from datamodules.samplers import ClassBalancedSampler

        labels = dataset.tensors[1]  # type: ignore[attr-defined]
        return ClassBalancedSampler(labels, num_samples=len(labels), seed=self.seed)

    # --- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The encoding (class names, columns, vocabularies, numeric statistics); empty before ``setup``."""
        if not self._fitted:
            return {}
        mean, std = self.standardizer.mean, self.standardizer.std
        return {
            "task": self.task,
            "target": self.target,
            "class_names": None if self._class_names is None else list(self._class_names),
            "numeric_columns": list(self.numeric_columns),
            "categorical_columns": list(self.categorical_columns),
            "vocabularies": {name: list(self.vocabularies[name]) for name in self.categorical_columns},
            "numeric_mean": [] if mean is None else mean.double().tolist(),
            "numeric_std": [] if std is None else std.double().tolist(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a checkpoint's encoding from now on (rebuilding the splits if ``setup`` already ran with another).

        Args:
            state_dict: What ``state_dict`` returned when the checkpoint was saved.
        """
        if not state_dict:
            return
        for key in ("task", "target"):
            if state_dict[key] != getattr(self, key):
                raise ValueError(
                    f"{NAME}: the checkpoint's data module has {key}={state_dict[key]!r} but this one has "
                    f"{key}={getattr(self, key)!r}"
                )
        if self._fitted and self.state_dict() == state_dict:
            return
        self._class_names = None if state_dict["class_names"] is None else list(state_dict["class_names"])
        self.numeric_columns = list(state_dict["numeric_columns"])
        self.categorical_columns = list(state_dict["categorical_columns"])
        self.vocabularies = {name: list(values) for name, values in state_dict["vocabularies"].items()}
        self.standardizer = Standardizer()
        if self.numeric_columns:
            self.standardizer.mean = torch.tensor(state_dict["numeric_mean"], dtype=torch.float64)
            self.standardizer.std = torch.tensor(state_dict["numeric_std"], dtype=torch.float64)
        self._restored = dict(state_dict)
        self._fitted = True
        if self.datasets:  # setup ran with another encoding: encode the splits again with this one
            self.datasets = {}
            self.class_counts = None
            self.setup()
