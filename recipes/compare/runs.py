"""Which runs ``recipes compare`` lists: the store, the experiments, and one search per experiment.

A table lists the runs of one experiment and one stage (``--stage``, default ``fit``; ``all`` for every stage),
that match ``--filter``, newest first, at most ``--max-runs`` of them; the others are counted so the command can
say how many it left out.
"""

from __future__ import annotations

from typing import Any

from recipes.compare.errors import CompareError
from recipes.compare.run_filter import RunFilter
from recipes.tracking.database_urls import masked_url
from recipes.tracking.sqlite_store import sqlite_database_path

STAGE_TAG = "loopwise.stage"
FIT_RUN_TAG = "loopwise.fit_run_id"
STAGES = ("fit", "validate", "test", "predict", "all")
PAGE = 1000


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


def run_stage(run: Any) -> str:
    """The command that made the run (tag ``loopwise.stage``), or ``?`` for a run made elsewhere."""
    return run.data.tags.get(STAGE_TAG, "?")


def search_runs(client: Any, experiment_id: str, stage: str, run_filter: RunFilter, max_runs: int) -> tuple[
    list[Any], int
]:
    """The newest ``max_runs`` runs of the experiment matching the stage and the filter, and how many more match.

    A filter MLflow refuses is a ``CompareError`` naming it, with MLflow's reason.
    """
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    stage_clause = "" if stage == "all" else f"tags.`{STAGE_TAG}` = '{stage}'"
    filter_string = run_filter.combined_with(stage_clause)
    runs: list[Any] = []
    left_out, token = 0, None
    while True:
        size = max_runs if not run_filter.numeric and token is None else PAGE
        try:
            page = client.search_runs([experiment_id], filter_string=filter_string, max_results=size,
                                      order_by=["attributes.start_time DESC"], page_token=token)
        except MlflowException as err:
            if run_filter.text and err.error_code == "INVALID_PARAMETER_VALUE":
                reason = (str(err.message).strip().splitlines() or ["refused"])[0][:300]
                message = f"--filter {run_filter.text!r} is not a valid MLflow search filter: {reason}"
                raise CompareError(message) from None
            raise
        for run in page:
            if not run_filter.keeps(run):
                continue
            if len(runs) < max_runs:
                runs.append(run)
            else:
                left_out += 1
        token = page.token
        if not token:
            return runs, left_out


__all__ = ["FIT_RUN_TAG", "STAGES", "STAGE_TAG", "check_sqlite", "find_experiments", "run_stage", "search_runs"]
