"""The rows of one ``recipes compare`` table: one dict per run, keys = the CSV/JSON column names.

Columns, in order: ``run`` (the label: what differs, ``compare_labels``), ``name`` (MLflow's run name), ``id``,
``experiment``, ``stage``, ``status``, ``by`` (who ran it where: ``user@host``, MLflow's ``mlflow.user`` and loopwise's
``loopwise.host``), ``start`` (UTC, ISO 8601), ``duration (s)``, ``data`` / ``data digest`` /
``data inputs`` (``compare_data``), ``fit run id`` (an evaluation run's training run), ``resumed from`` (a branch:
``<run id> @ step <step>``, the run and step an older checkpoint resumed it from), one column per differing
param under its full name (``params.model.init_args.lr``, as in MLflow's search syntax), then ``metric`` (the name
the run logged it under: ``test/acc`` for a test run of a ``val/acc`` table), ``best``, ``last``, ``best step`` and
``best epoch``.

``best epoch`` counts from 1, as the epoch lines printed during training do (``epoch 3/40``): it is the ``epoch``
metric Lightning logged at the best step (which counts from 0), plus one. Evaluation runs have none.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from recipes.compare.data import data_digest, data_inputs_text, data_marks, data_summary
from recipes.tracking.run_datasets import data_record
from recipes.compare.labels import differing_params, run_labels
from recipes.compare.metric import metric_of_run, summarize_history
from recipes.compare.runs import FIT_RUN_TAG, run_stage
from recipes.tracking.checkpoint_facts import who_ran

RESUMED_FROM_TAG = "loopwise.resumed_from_run"  # the names run_continuity writes (not imported: compare needs no
RESUMED_FROM_STEP_TAG = "loopwise.resumed_from_step"  # Lightning callback to read a table)

EVALUATION_STAGES = ("validate", "test", "predict")


@dataclass
class RunsTable:
    """One experiment's runs, compared on one metric."""

    experiment: str
    metric: str
    rows: list[dict[str, Any]]
    runs: list[Any]
    params: list[str]
    label_params: list[str]
    histories: dict[str, list[Any]]
    data: str
    left_out: int = 0

    @property
    def stages(self) -> list[str]:
        """The stages of the listed runs, in the order of the rows."""
        return list(dict.fromkeys(row["stage"] for row in self.rows))


def iso_time(ms: int | None) -> str:
    """An MLflow timestamp (ms) as ``2026-01-02T03:04:05Z``."""
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_s(run: Any) -> float | None:
    """The run's wall time in seconds (None while it runs)."""
    if run.info.start_time and run.info.end_time:
        return round((run.info.end_time - run.info.start_time) / 1000, 1)
    return None


def epoch_at(client: Any, run_id: str, step: int | None) -> int | None:
    """The epoch, counted from 1, that Lightning's ``epoch`` metric (from 0) names at ``step``."""
    if step is None:
        return None
    try:
        epochs = client.get_metric_history(run_id, "epoch")
    except Exception:  # noqa: BLE001 - a run without the metric, or a store that refuses: no epoch
        return None
    at = [m.value for m in sorted(epochs, key=lambda m: m.timestamp) if m.step == step]
    return int(at[-1]) + 1 if at else None


def resumed_from(run: Any) -> str:
    """``<run id> @ step <step>`` for a branch (a run resumed from an older checkpoint of another run), else ``""``."""
    tags = run.data.tags
    source = tags.get(RESUMED_FROM_TAG, "")
    return f"{source} @ step {tags.get(RESUMED_FROM_STEP_TAG, '?')}" if source else ""


def build_table(client: Any, runs: list[Any], metric: str, experiment: str, left_out: int = 0) -> RunsTable:
    """The rows of ``runs`` (one experiment), their labels, data marks and ``metric``'s summary."""
    stages = [run_stage(run) for run in runs]
    params = differing_params(runs)
    records = [data_record(run) for run in runs]
    labels, named = run_labels(runs, stages, [data_digest(record) for record in records])
    marks = data_marks(records)
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[Any]] = {}
    for run, stage, label, record, mark in zip(runs, stages, labels, records, marks):
        run_id = run.info.run_id
        own = metric_of_run(metric, run)
        history = client.get_metric_history(run_id, own) if own in run.data.metrics else []
        histories[run_id] = history
        summary = summarize_history(history, metric)
        row: dict[str, Any] = {
            "run": label,
            "name": run.info.run_name or "",
            "id": run_id,
            "experiment": experiment,
            "stage": stage,
            "status": run.info.status,
            "by": who_ran(dict(run.data.tags)),
            "start": iso_time(run.info.start_time),
            "duration (s)": duration_s(run),
            "data": mark,
            "data digest": data_digest(record),
            "data inputs": data_inputs_text(record),
            "fit run id": run.data.tags.get(FIT_RUN_TAG, ""),
            "resumed from": resumed_from(run),
        }
        row.update({f"params.{key}": run.data.params.get(key) for key in params})
        best_epoch = None if stage in EVALUATION_STAGES else epoch_at(client, run_id, summary["best_step"])
        row.update({"metric": own, "best": summary["best"], "last": summary["last"],
                    "best step": summary["best_step"], "best epoch": best_epoch})
        rows.append(row)
    return RunsTable(experiment, metric, rows, list(runs), params, named, histories, data_summary(records), left_out)


__all__ = ["RunsTable", "build_table", "duration_s", "epoch_at", "iso_time", "resumed_from"]
