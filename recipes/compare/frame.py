"""The runs ``recipes compare`` reads: ``mlflow.search_runs``' DataFrame, one row per run.

Its columns: ``run_id``, ``status``, ``start_time`` and ``end_time`` (UTC timestamps; NaT while a run runs),
``params.<name>`` and ``tags.<name>`` (None where a run has none: ``with_none``) and ``metrics.<name>`` (the
last value; NaN where a run has none, and where the last value was NaN: ``compare_metric`` tells the two apart).
The functions of ``compare`` that take the runs take this DataFrame, or a list of MLflow ``Run`` objects already
in hand (a caller's, a test's), which ``runs_frame`` puts in the same columns.
"""

from __future__ import annotations

from typing import Any


def runs_frame(runs: Any) -> Any:
    """``runs`` as ``mlflow.search_runs``' DataFrame: itself, or the columns of a list of ``Run`` objects."""
    import pandas as pd  # noqa: PLC0415 - imported with MLflow's search, not with the command's parser

    if isinstance(runs, pd.DataFrame):
        return runs
    records = []
    for run in runs:
        info, data = run.info, run.data
        times = {key: pd.to_datetime(getattr(info, key, None), unit="ms", utc=True)
                 for key in ("start_time", "end_time")}
        tags = {"mlflow.runName": info.run_name, **getattr(data, "tags", {})}
        records.append({"run_id": info.run_id, "status": getattr(info, "status", None), **times,
                        **{f"metrics.{k}": v for k, v in getattr(data, "metrics", {}).items()},
                        **{f"params.{k}": v for k, v in data.params.items()},
                        **{f"tags.{k}": v for k, v in tags.items()}})
    columns = dict.fromkeys(["run_id", "status", "start_time", "end_time"])
    return with_none(pd.DataFrame(records, columns=list(columns | dict.fromkeys(k for r in records for k in r))))


def with_none(frame: Any) -> Any:
    """``frame`` with None in its params and tags columns where a run has none (as MLflow fills them; pandas 3 reads
    them as strings, NaN where missing)."""
    texts = [column for column in frame.columns if column.startswith(("params.", "tags."))]
    frame = frame.astype({column: object for column in texts})
    frame[texts] = frame[texts].where(frame[texts].notna(), None)
    return frame


def present(value: Any) -> bool:
    """False for a DataFrame's empty cell (None, NaN, NaT)."""
    return value is not None and value == value  # noqa: PLR0124 - NaN and NaT are not equal to themselves


def prefixed(record: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The values of one run's ``<prefix><name>`` columns by name, without the empty ones (``prefixed(r, "tags.")``)."""
    return {key[len(prefix):]: value for key, value in record.items() if key.startswith(prefix) and present(value)}


def params_of(frame: Any) -> Any:
    """The ``params.*`` columns named without the prefix, only the params some listed run has (None where not)."""
    params = frame[[c for c in frame.columns if c.startswith("params.")]]
    params = params.loc[:, params.notna().any()]
    return params.rename(columns=lambda column: column[len("params."):])


def epoch_ms(moment: Any) -> int | None:
    """A DataFrame timestamp as MLflow's milliseconds (None for NaT)."""
    return moment.value // 1_000_000 if present(moment) else None


__all__ = ["epoch_ms", "params_of", "prefixed", "present", "runs_frame", "with_none"]
