"""Which runs ``recipes compare`` lists: the store, the experiments, and one ``mlflow.search_runs`` per experiment.

A table lists the runs of one experiment and one stage (``--stage``, default ``fit``; ``all`` for every stage),
that match ``--filter``, newest first, at most ``--max-runs`` of them; the others are counted so the command can
say how many it left out.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Iterator

from recipes.compare.errors import CompareError
from recipes.compare.frame import present, with_none
from recipes.compare.run_filter import RunFilter
from recipes.tracking.database_urls import masked_url
from recipes.tracking.sqlite_store import sqlite_database_path

STAGE_TAG = "loopwise.stage"
FIT_RUN_TAG = "loopwise.fit_run_id"
STAGES = ("fit", "validate", "test", "predict", "all")
EVERY_RUN = 2**31 - 1  # max_results: every matching run (MLflow pages through them)
TRACKING_URI_VARIABLE = "MLFLOW_TRACKING_URI"


def check_sqlite(uri: str) -> None:
    """An SQLite URI must name an existing file: MLflow would silently create an empty store."""
    path = sqlite_database_path(uri)
    if path is not None and not path.is_file():
        raise CompareError(f"no MLflow database at {path} (tracking URI {masked_url(uri)}); run a recipe first")


def find_experiments(client: Any, name: str | None) -> list[Any]:
    """The experiment called ``name``, or every experiment (oldest first) when ``name`` is None."""
    if name is not None:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            known = sorted(e.name for e in client.search_experiments())
            raise CompareError(
                f"experiment {name!r} not found at {masked_url(client.tracking_uri)}; known: "
                f"{', '.join(known) or 'none'}"
            )
        return [exp]
    return sorted(client.search_experiments(), key=lambda e: (e.creation_time or 0, e.name))


def run_stages(frame: Any) -> list[str]:
    """The command that made each run (tag ``loopwise.stage``), or ``?`` for a run made elsewhere."""
    column = f"tags.{STAGE_TAG}"
    return [value if present(value) else "?" for value in frame[column]] if column in frame else ["?"] * len(frame)


@contextmanager
def tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to ``uri`` for the block (``mlflow.search_runs`` reads it), then as it was."""
    import mlflow  # noqa: PLC0415

    environment = os.environ.get(TRACKING_URI_VARIABLE)
    before = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(None if before == environment else before)  # None: the variable decides, as before
        if environment is None:
            os.environ.pop(TRACKING_URI_VARIABLE, None)
        else:
            os.environ[TRACKING_URI_VARIABLE] = environment


def search_runs(client: Any, experiment_id: str, stage: str, run_filter: RunFilter, max_runs: int) -> tuple[
    Any, int
]:
    """The newest ``max_runs`` runs of the experiment matching the stage and the filter (``mlflow.search_runs``'
    DataFrame, newest first), and how many more match.

    One search returns every matching run, so the ones past ``max_runs`` are counted. A filter MLflow refuses is a
    ``CompareError`` naming it, with MLflow's reason.
    """
    import mlflow  # noqa: PLC0415
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    stage_clause = "" if stage == "all" else f"tags.`{STAGE_TAG}` = '{stage}'"
    try:
        with tracking_uri(client.tracking_uri):
            frame = mlflow.search_runs(experiment_ids=[experiment_id],
                                       filter_string=run_filter.combined_with(stage_clause),
                                       order_by=["attributes.start_time DESC"], max_results=EVERY_RUN,
                                       output_format="pandas")
    except MlflowException as err:
        if run_filter.text and err.error_code == "INVALID_PARAMETER_VALUE":
            reason = (str(err.message).strip().splitlines() or ["refused"])[0][:300]
            raise CompareError(f"--filter {run_filter.text!r} is not a valid MLflow search filter: {reason}") from None
        raise
    frame = with_none(frame)
    frame = frame.iloc[[i for i, keep in enumerate(run_filter.kept(frame)) if keep]]
    return frame.head(max_runs).reset_index(drop=True), max(len(frame) - max_runs, 0)


__all__ = ["FIT_RUN_TAG", "STAGES", "STAGE_TAG", "check_sqlite", "find_experiments", "run_stages", "search_runs",
           "tracking_uri"]
