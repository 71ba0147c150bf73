"""A table from a CSV or Parquet file: scaled numeric columns (missing values imputed) and one-hot categorical columns,
in memory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from datamodules.base import BaseDataModule
from datamodules.column_encoding import MISSING_MODES, ColumnEncoder, MissingMode, is_numeric_column
from datamodules.csv_reading import shown_fields
from datamodules.numeric_scaling import SCALINGS, ScalingKind
from datamodules.preprocessing import Standardizer
from datamodules.row_checks import UNKNOWN_COLUMN, unknown_categories
from datamodules.row_checks import unknown_categories_warning
from datamodules.table_files import read_table, table_format
from datamodules.target_kind import TargetKindError, target_kind_error
from datamodules.table_rows import EncodedTableRows

if TYPE_CHECKING:  # pandas is imported when a file is read, not at start-up
    import pandas as pd

NAME = "TabularDataModule"
#: ``batch_size="auto"``: the largest power of two <= train rows / AUTO_BATCH_STEPS, within [AUTO_BATCH_MIN,
#: AUTO_BATCH_MAX] (at least about 16 steps an epoch where the table allows).
AUTO_BATCH_STEPS = 16
AUTO_BATCH_MIN = 16
AUTO_BATCH_MAX = 512


def auto_batch_size(train_rows: int) -> int:
    """``batch_size="auto"`` for a train split of ``train_rows`` rows: the largest power of two <= ``train_rows /
    16``, clipped to [16, 512] (150 rows: 16; 1,667: 64; 7,000: 256; 35,000: 512)."""
    size = AUTO_BATCH_MIN
    while size * 2 <= train_rows / AUTO_BATCH_STEPS and size * 2 <= AUTO_BATCH_MAX:
        size *= 2
    return size


class TabularDataModule(EncodedTableRows, BaseDataModule):
    """Rows of a CSV or Parquet file as one float tensor per row, for classification or regression.

    The file is read in ``setup`` (with pandas) and held in memory; it is never modified. Feature columns are numeric or
    categorical. A column is numeric when pandas reads it as numbers (not ``true``/``false``); text, mixed values and
    ``true``/``false`` are categorical. Integer columns are numeric: counts and ordinal codes keep their order; list
    a code column (a zip code, a product id) in ``categorical`` to one-hot encode it. A column of numbers with empty
    fields is numeric (pandas reads it as floats with NaN); a numeric column with no value in the train split (all
    empty) is refused in ``setup`` with a message naming it.

    Numeric columns are scaled (``scaling``) with statistics of the train split's observed values; they are the
    first ``numeric_features`` positions of a sample. With ``missing="impute"`` (the default) a missing number
    takes the train split's median of its column, and each numeric column with a missing value in the train split
    gets a missing-indicator (``"column=<missing>"``: 1.0 where the value was missing) after the numeric columns; a
    missing number at predict time in a column that had none in the train split is imputed the same way (without an
    indicator: the width is fixed by the train split). Categorical columns become one-hot blocks after those, so a
    sample is one float32 vector of width ``in_features`` (names in ``feature_names``) that an MLP takes as it is.

    Categorical vocabularies come from the train split only: in each column's block, position 0
    (``"column=<unknown>"``) stands for values not seen in the train split, position 1 (``"column=<missing>"``,
    ``missing="impute"`` only) for missing values; the known values follow in sorted order of their string form
    (integral numbers are written without ``.0``). With ``missing="error"`` a missing number is an error naming its
    row and a missing category takes the ``<unknown>`` slot (the encoding of checkpoints written before missing
    values were taken, which keep it). The encoding is a ``ColumnEncoder`` (``encoder``), fitted on the train rows.

    Classification: the labels (ints or strings) become class ids 0..C-1 in sorted order of the distinct labels of
    the whole file (numeric labels sorted by value, others by their string), named in ``class_names``; the split is
    stratified. Regression: the targets are raw float32 values of shape ``(N,)`` (not standardized) and the split is
    not stratified. Class names, vocabularies and numeric statistics are this module's ``state_dict``, which
    Lightning stores in every checkpoint; restoring it makes the module encode any file as the checkpoint's model
    expects.

    Bad input fails when the module is built or in ``setup`` (before any training) with a message naming the file,
    column, row and value; rows count data rows from 0 (a CSV header is not a row).

    The other arguments (``val_fraction``, ``test_fraction``, ``seed``, the loader options) are ``BaseDataModule``'s,
    passed on through ``**kwargs``; ``stratify`` follows ``task``.

    Args:
        path: The data file: ``.csv``, or ``.parquet``/``.pq``.
        target: The column to predict.
        features: The columns to use as inputs, in this order; default: every column except the target.
        categorical: The feature columns to one-hot encode; every other feature must hold numbers only (``true``/
            ``false`` there is an error naming the row). Default: the feature columns that are not numbers
            (strings, mixed values, ``true``/``false``).
        task: "classification" (the target holds class labels) or "regression" (the target holds numbers).
        class_balance: Draw training samples with inverse class-frequency weights (ClassBalancedSampler), so every
            class is seen equally often (draws seeded by ``seed``); classification only. Validation and test keep
            the true distribution.
        predict_path: A new table (same format and feature columns as ``path``; the target column may be absent
            and is ignored) that ``predict`` scores row by row, in file order, with the encoding the model was
            trained with (restored from the checkpoint, never fitted on this file). Default: predict the test split.
        many_classes: Accept a classification target of integral numbers with many distinct values (a real
            many-class problem). Without it, more than 50 distinct values, or 10 or more of which most occur in one
            row only, is refused in ``setup`` (``TargetKindError``): such a column is a quantity to predict with
            ``task: regression``. A regression target of labels (text, ``true``/``false``) is refused too.
        missing: What a missing value (an empty field, NaN, null) in a feature column does: "impute" (a number takes
            the train split's median of its column, plus a missing-indicator for columns with missing train values;
            a category takes its column's ``<missing>`` slot) or "error" (a missing number is an error naming the
            row; a missing category takes the ``<unknown>`` slot). A checkpoint's model keeps the mode it was
            trained with.
        scaling: How numeric columns are scaled, with statistics of the train split's observed values: "standard"
            (``(x - mean) / std``), "quantile" (each value's quantile level mapped to a standard normal, from up to
            1,024 quantiles: skewed and heavy-tailed columns come out about N(0, 1)) or "robust" (``(x - median) /
            IQR``, then smoothly clipped to +-3: RealMLP's scaling).
        batch_size: Samples per batch (train, val, test and predict), or "auto": the largest power of two at most
            the train rows / 16, within [16, 512] (150 train rows: 16, about 10 steps an epoch; 1,667: 64; 7,000:
            256; 35,000 or more: 512), chosen in ``setup`` once the split is known; ``batch_size`` is then that
            number (the saved setting stays "auto"). Before ``setup`` (predicting raw rows with a restored module)
            "auto" batches 512 rows.
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
        predict_path: str | None = None,
        many_classes: bool = False,
        missing: MissingMode = "impute",
        scaling: ScalingKind = "standard",
        batch_size: int | Literal["auto"] = 64,
        **kwargs: Any,
    ) -> None:
        if missing not in MISSING_MODES:
            raise ValueError(f"{NAME}: missing must be one of {list(MISSING_MODES)}, got {missing!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"{NAME}: scaling must be one of {list(SCALINGS)}, got {scaling!r}")
        auto = batch_size == "auto"
        if not auto and (isinstance(batch_size, bool) or not isinstance(batch_size, int)):
            raise ValueError(f"{NAME}: batch_size must be a whole number >= 1 or 'auto', got {batch_size!r}")
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
        if predict_path is not None:
            table_format(predict_path)
        # "auto" stays the saved setting (this frame's batch_size); loaders batch AUTO_BATCH_MAX until setup
        super().__init__(
            stratify=task == "classification", batch_size=AUTO_BATCH_MAX if auto else batch_size, **kwargs
        )
        self.auto_batch_size = auto
        self.missing = missing
        self.scaling = scaling
        self.path = path
        self.target = target
        self.features = features
        self.categorical = categorical
        self.task = task
        self.class_balance = class_balance
        self.predict_path = predict_path
        self.many_classes = many_classes
        # the encoding: fitted in setup, or restored from a checkpoint with load_state_dict
        self.encoder = self._new_encoder()
        self._restored: dict[str, Any] | None = None
        self._new_data_notes: list[str] = []  # predict_path's rows' values predicted with the <unknown> slot
        self._frame: pd.DataFrame | None = None  # the file's rows during setup; a sample is a row position

    def _new_encoder(self, numeric: list[str] | None = None, categorical: list[str] | None = None) -> ColumnEncoder:
        """A ``ColumnEncoder`` for this module's file: its messages name the module and the file."""
        return ColumnEncoder(
            self.target,
            self.task,
            numeric or [],
            categorical or [],
            owner=NAME,
            source=self._where(),
            warn=rank_zero_warn,  # under DDP, one warning instead of one per process
            missing=self.missing,  # type: ignore[arg-type]
            scaling=self.scaling,  # type: ignore[arg-type]
        )

    # --- description ----------------------------------------------------------------------------------------
    def _ensure_fitted(self) -> None:
        """Run ``setup`` unless the encoding is fitted or restored."""
        if not self.encoder.fitted:
            self.setup()

    def fitted_encoder(self) -> ColumnEncoder:
        """The encoding: the checkpoint's, or the one the train split gives (``setup`` runs if needed)."""
        self._ensure_fitted()
        return self.encoder

    @property
    def class_names(self) -> list[str] | None:
        """Name of each class id (the file's sorted labels); ``None`` for regression. Reads the file if needed."""
        if self.task == "regression":
            return None
        if self.encoder.class_names is None:
            self.setup()
        return self.encoder.class_names

    @property
    def numeric_columns(self) -> list[str]:
        """The standardized feature columns, in input order (after ``setup``)."""
        return self.encoder.numeric_columns

    @property
    def categorical_columns(self) -> list[str]:
        """The one-hot encoded feature columns, in input order after the numeric ones (after ``setup``)."""
        return self.encoder.categorical_columns

    @property
    def vocabularies(self) -> dict[str, list[str]]:
        """The train split's values of each categorical column, sorted (after ``setup``)."""
        return self.encoder.vocabularies

    @property
    def standardizer(self) -> Standardizer | None:
        """Mean and std of the numeric columns over the train split (after ``setup``; ``scaling="standard"``, else
        ``None``: the scaler is ``encoder.scaler``)."""
        return self.encoder.standardizer

    # --- reading and checking the file --------------------------------------------------------------------
    def _where(self) -> str:
        return f"{self.path!r}"

    def _resolve_columns(self, frame: "pd.DataFrame") -> tuple[list[str], list[str]]:
        """The numeric and the categorical feature columns, checked against the file."""
        available = list(frame.columns)
        if self.target not in available:
            raise ValueError(
                f"{NAME}: the target column {self.target!r} is not in {self._where()}; available columns: "
                f"{shown_fields(available)}"
            )
        if self._restored is not None:
            numeric, categorical = list(self.encoder.numeric_columns), list(self.encoder.categorical_columns)
            missing = [c for c in numeric + categorical if c not in available]
            if missing:
                raise ValueError(
                    f"{NAME}: the checkpoint's model was trained on columns {missing}, which are not in "
                    f"{self._where()}; available columns: {shown_fields(available)}"
                )
            return numeric, categorical
        features = self.features if self.features is not None else [c for c in available if c != self.target]
        missing = [c for c in features if c not in available]
        if missing:
            raise ValueError(
                f"{NAME}: feature column(s) {missing} are not in {self._where()}; available columns: "
                f"{shown_fields(available)}"
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

        if pd.api.types.is_bool_dtype(column):  # true/false: categorical by design, not a typo
            return
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

    # --- the BaseDataModule hooks ---------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """Read and check the file, split it, fit the encoder on the train rows and encode every split."""
        try:
            super().setup(stage)
        finally:
            self._frame = None  # the splits hold the encoded rows

    def load(self) -> tuple[Tensor, Tensor]:
        """The position of every row of the file, and its target; the whole file is checked first."""
        frame = read_table(self.path)
        if self._restored is None and self.target in frame.columns:  # the task's kind first: before column details
            mismatch = target_kind_error(
                frame[self.target], self.target, self.task, self._where(), NAME, many_classes=self.many_classes
            )
            if mismatch:
                raise TargetKindError(mismatch)
        numeric, categorical = self._resolve_columns(frame)
        if self._restored is None:  # class names from this file's labels, also when an earlier setup failed half-way
            self.encoder = self._new_encoder(numeric, categorical)
        targets = self.encoder.targets(frame)
        self.encoder.numeric_values(frame)  # every numeric value is a finite number (or missing, to impute), or the
        # error names its row
        self._frame = frame
        return torch.arange(len(frame)), targets

    def check_split_sizes(self, indices: dict[str, Tensor]) -> None:
        """Choose ``batch_size`` for ``batch_size="auto"`` from the train rows, then the base class's checks."""
        if self.auto_batch_size:
            self.batch_size = auto_batch_size(len(indices["train"]))
        super().check_split_sizes(indices)

    def _rows(self, positions: Tensor) -> "pd.DataFrame":
        """The rows of the file at ``positions`` (the samples of a split), while ``setup`` holds the file."""
        if self._frame is None:
            raise RuntimeError(f"{NAME}: the file's rows are read by load(), in setup(); call setup() instead")
        return self._frame.iloc[positions.numpy()]

    def fit_preprocessing(self, train_rows: Tensor) -> None:
        """Fit the encoder on the train rows (a restored encoding is kept as it is)."""
        if self._restored is None:  # otherwise the checkpoint's encoding, not a new one
            self.encoder.fit(self._rows(train_rows))

    def preprocess(self, rows: Tensor) -> Tensor:
        """The rows at these positions, encoded: float32 ``(N, in_features)``."""
        return self.encoder.transform(self._rows(rows))

    def train_sampler(self, dataset: Dataset) -> Sampler | None:
        """``ClassBalancedSampler`` over the train labels with ``class_balance``; seeded shuffling otherwise."""
        if not self.class_balance:
            return None
        from datamodules.samplers import ClassBalancedSampler

        labels = dataset.tensors[1]  # type: ignore[attr-defined]
        return ClassBalancedSampler(labels, num_samples=len(labels), seed=self.seed)

    # --- new data -------------------------------------------------------------------------------------------------
    def predicts_new_data(self) -> bool:
        return self.predict_path is not None

    def new_data(self) -> tuple[Dataset, list[Any]] | None:
        """The rows of ``predict_path`` encoded as at training time, with their row numbers (from 0); one warning
        when categories take the ``<unknown>`` slot (once: the command reads the file twice)."""
        if self.predict_path is None:
            return None
        frame, source = read_table(self.predict_path), repr(self.predict_path)
        data = self.frame_data(frame, source)
        notes = unknown_categories(self.encoder, frame.rename(columns=str).reset_index(drop=True))
        if notes != self._new_data_notes and (warning := unknown_categories_warning(NAME, notes, source)):
            rank_zero_warn(warning)
        self._new_data_notes = notes
        return data

    def prediction_notes(self, frame: "pd.DataFrame | None" = None) -> dict[str, list[str]]:
        """The predictions' column ``unknown_categories`` (``plan='gold'``: values that took the ``<unknown>`` slot;
        also ``region=<missing>`` with ``missing="error"``) of raw rows, or (``None``) of ``predict_path``'s last read; none when no row has one."""
        if frame is not None:
            return self.row_notes(frame)
        return {UNKNOWN_COLUMN: self._new_data_notes} if any(self._new_data_notes) else {}

    def raw_examples(self, count: int = 5) -> "pd.DataFrame":
        """The first ``count`` rows of the data file's feature columns, as read (the target left out)."""
        self._ensure_fitted()
        columns = list(self.encoder.numeric_columns) + list(self.encoder.categorical_columns)
        return read_table(self.path)[columns].head(count)

    # --- checkpoints ------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The encoding (class names, columns, vocabularies, numeric statistics); empty before ``setup``."""
        return self.encoder.state_dict() if self.encoder.fitted else {}

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
        if self.encoder.fitted and self.state_dict() == state_dict:
            return
        self.encoder = self._new_encoder()
        self.encoder.load_state_dict(state_dict)
        self._restored = dict(state_dict)
        if self.datasets:  # setup ran with another encoding: encode the splits again with this one
            self.datasets = {}
            self.class_counts = None
            self.setup()
