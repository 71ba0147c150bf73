"""Reading a table file for ``TabularDataModule``: CSV or Parquet, with clear one-line errors for a missing,
unreadable, empty or badly headed file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from datamodules.csv_reading import fields_of_any_length, not_utf8_message, shown_fields
from datamodules.file_paths import unreachable_reason

if TYPE_CHECKING:  # pandas is imported when a file is read, not at start-up
    import pandas as pd

NAME = "TabularDataModule"
FORMATS = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}


def table_format(path: str | Path) -> str:
    """``"CSV"`` or ``"Parquet"`` from the file's suffix (.csv, .parquet, .pq); a ValueError for anything else."""
    kind = FORMATS.get(Path(path).suffix.lower())
    if kind is None:
        raise ValueError(
            f"{NAME}: cannot tell the format of {str(path)!r} from its suffix {Path(path).suffix!r}: use a .csv, "
            ".parquet or .pq file"
        )
    return kind


def check_unique_header(file: Path, owner: str) -> None:
    """A CSV header that names a column twice is an error (pandas would rename the second ``x`` to ``x.1``)."""
    import csv

    with file.open(encoding="utf-8-sig", newline="") as handle, fields_of_any_length():
        header = next(csv.reader(handle), [])
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(
            f"{owner}: the header of {str(file)!r} names the column(s) {repeated} more than once; rename them so "
            "each column has its own name"
        )


def read_table(path: str | Path) -> "pd.DataFrame":
    """The whole file as a DataFrame with string column names; clear errors for missing, unreadable, empty files."""
    kind = table_format(path)
    file = Path(path).expanduser()
    problem = unreachable_reason(file)
    if problem is not None and os.path.islink(file):  # a link loop or a dangling link: resolve() would raise
        raise FileNotFoundError(f"{NAME}: the data file {problem}")
    if problem is not None:
        raise FileNotFoundError(f"{NAME}: the data file {str(path)!r} does not exist (resolved: {file.resolve()})")
    if not file.is_file():
        raise ValueError(f"{NAME}: {str(path)!r} is not a file")
    import pandas as pd

    try:
        if kind == "CSV":
            check_unique_header(file, NAME)
    except UnicodeDecodeError as err:
        raise ValueError(f"{NAME}: {not_utf8_message(file, err)}") from None
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
    except UnicodeDecodeError as err:
        raise ValueError(f"{NAME}: {not_utf8_message(file, err)}") from None
    except pd.errors.EmptyDataError as err:
        raise ValueError(f"{NAME}: the data file {str(path)!r} is empty (no header, no rows)") from err
    except Exception as err:  # parser, encoding and Arrow errors all mean the same thing to the user
        raise ValueError(f"{NAME}: cannot read {str(path)!r} as {kind}: {type(err).__name__}: {err}") from err
    if len(frame.columns) == 0 or len(frame) == 0:
        columns = shown_fields(list(frame.columns))
        raise ValueError(f"{NAME}: the data file {str(path)!r} has no data rows (columns: {columns})")
    frame.columns = [str(c) for c in frame.columns]
    return frame.reset_index(drop=True)  # rows are positions (a Parquet file may restore a stored index)


__all__ = ["FORMATS", "check_unique_header", "read_table", "table_format"]
