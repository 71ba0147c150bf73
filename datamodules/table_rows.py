"""Raw rows of a table (a pandas DataFrame, as a user or a served model sends them) encoded as the data module's
checkpoint encodes them: what the MLflow model of a tabular run predicts with. Shared by ``TabularDataModule`` and
``StreamingTableDataModule``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset

from datamodules.column_encoding import ColumnEncoder
from datamodules.csv_reading import shown_fields
from datamodules.row_checks import UNKNOWN_COLUMN, bad_numbers, bad_numbers_message, unknown_categories
from datamodules.tensor_dataset import BatchedTensorDataset

if TYPE_CHECKING:
    import pandas as pd


class EncodedTableRows:
    """The sizes a network needs (``num_classes``, ``out_features``, ``in_features``, ``numeric_features``,
    ``feature_names``), and ``frame_data``, ``check_rows`` and ``prediction_notes`` for raw rows, from the fitted
    ``ColumnEncoder`` that ``fitted_encoder()`` returns (the checkpoint's, or the one ``setup`` fits). A subclass has
    ``task`` and ``class_names``."""

    task: str

    def fitted_encoder(self) -> ColumnEncoder:
        """The encoding, fitted or restored (a subclass runs ``setup`` when it has neither)."""
        raise NotImplementedError

    @property
    def class_names(self) -> list[str] | None:
        """Name of each class id; ``None`` for regression (the subclass's)."""
        raise NotImplementedError

    @property
    def num_classes(self) -> int | None:
        """Number of classes (distinct labels of the table); ``None`` for regression."""
        names = self.class_names
        return None if names is None else len(names)

    @property
    def out_features(self) -> int:
        """Output width the network needs: ``num_classes`` for classification, 1 for regression."""
        return 1 if self.task == "regression" else int(self.num_classes or 0)

    @property
    def in_features(self) -> int:
        """Width of one encoded row: the numeric columns, their missing-indicators and one block per categorical
        column (its vocabulary, ``<unknown>`` and, with ``missing="impute"``, ``<missing>``)."""
        return self.fitted_encoder().in_features

    @property
    def numeric_features(self) -> int:
        """The number of leading scaled numeric positions of a row (missing-indicators not counted): what a network
        with numerical embeddings embeds one by one."""
        return self.fitted_encoder().numeric_features

    @property
    def feature_names(self) -> list[str]:
        """Name of each input position: numeric columns, ``column=<missing>`` indicators, then each categorical
        block's ``column=<unknown>``, ``column=<missing>`` and ``column=value`` entries."""
        return self.fitted_encoder().feature_names

    def feature_frame(self, frame: pd.DataFrame, source: str) -> pd.DataFrame:
        """Raw rows with string column names and rows counted from 0; a feature column missing is an error."""
        encoder = self.fitted_encoder()
        frame = frame.rename(columns=str).reset_index(drop=True)
        needed = list(encoder.numeric_columns) + list(encoder.categorical_columns)
        missing = [c for c in needed if c not in frame.columns]
        if missing:
            raise ValueError(
                f"{type(self).__name__}: {source} lacks the feature column(s) {missing} the model was trained on "
                f"(columns it has: {shown_fields(list(frame.columns))}); add them (a categorical column may be empty)"
            )
        return frame

    def frame_data(self, frame: pd.DataFrame, source: str = "the table") -> tuple[Dataset, list[Any]]:
        """Raw rows (the feature columns as in the data file; the target may be absent) encoded as at training
        time, with their row numbers (from 0). A feature column the model was trained on must be there."""
        frame = self.feature_frame(frame, source)
        features = self.fitted_encoder().transform(frame, source=source)  # errors name the table being predicted
        return BatchedTensorDataset(features), list(range(len(frame)))

    def check_rows(self, frame: pd.DataFrame) -> None:
        """One ``ValueError`` naming every value of raw rows no numeric column takes ("row 3, column 'age': true is
        not a number"), or a missing feature column: the MLflow model's check of a request before it predicts."""
        if cells := bad_numbers(self.fitted_encoder(), self.feature_frame(frame, "the table")):
            raise ValueError(bad_numbers_message(type(self).__name__, cells))

    def row_notes(self, frame: pd.DataFrame) -> dict[str, list[str]]:
        """The predictions' column ``unknown_categories`` of raw rows (values that took the ``<unknown>`` slot);
        none when no row has one."""
        notes = unknown_categories(self.fitted_encoder(), self.feature_frame(frame, "the table"))
        return {UNKNOWN_COLUMN: notes} if any(notes) else {}
