"""``recipes compare``: a side-by-side table of MLflow runs, their differing params and one metric.

Usage (dispatched by ``recipes compare ...``; ``main`` takes the arguments after ``compare``)::

    recipes compare                                  # every experiment, fit runs, the monitored metric
    recipes compare --experiment spiral_mlp --metric val/acc --plot curves.png
    recipes compare --stage all --format csv > runs.csv

Decisions:

* Metric: ``--metric``, else the monitored metric of the newest listed run that has a ``config.yaml`` artifact
  (``model.init_args.monitor``, else the ``default_monitor`` of ``model.class_path``), else ``val/loss``. The
  first candidate that any listed run has logged is used. ``config.yaml`` is read as data (``yaml.safe_load``):
  ``model.class_path`` is compared as text with loopwise's tasks (and ``Task`` subclasses already imported), never
  imported, so a run's artifact never chooses what code runs.
* Best = min for names ending in loss/error/mae/mse/rmse/perplexity/ppl, else max; ties go to the earliest step.
  "Last" is the value at the highest step. "best epoch" is the ``epoch`` metric logged at the best step.
* Params: only those whose values differ between the listed runs (a missing param counts as a value). The table
  shows at most ``MAX_PARAM_COLUMNS`` of them and names the rest below it; CSV and JSON carry all of them, and the
  full run id instead of its first 8 characters.
* Runs are listed newest first. A missing SQLite file, an unknown experiment, no matching runs, a metric no run
  logged, or an unreachable tracking server end with a ``recipes compare: error:`` line and exit code 2.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from recipes.sqlite_store import sqlite_database_path
from recipes.tracking import default_tracking_uri, fast_http_failures

PROG = "recipes compare"
MAX_PARAM_COLUMNS = 12
LOWER_IS_BETTER = ("loss", "error", "mae", "mse", "rmse", "perplexity", "ppl")
STAGE_TAG = "loopwise.stage"
STAGES = ("fit", "validate", "test", "predict", "all")
FALLBACK_METRIC = "val/loss"


class CompareError(Exception):
    """A problem reported as one error line and exit code 2."""


# --- metric helpers --------------------------------------------------------------------------------------------
def lower_is_better(metric: str) -> bool:
    """True for losses and errors (best = min), False for scores (best = max)."""
    name = metric.rsplit("/", 1)[-1].lower()
    return any(name.endswith(suffix) for suffix in LOWER_IS_BETTER)


def summarize_history(history: list[Any], metric: str) -> dict[str, Any]:
    """Best value, its step, and the last value of an MLflow metric history (``Metric`` objects)."""
    if not history:
        return {"best": None, "last": None, "best_step": None}
    ordered = sorted(history, key=lambda m: (m.step, m.timestamp))
    sign = 1 if lower_is_better(metric) else -1
    best = min(ordered, key=lambda m: (sign * m.value, m.step))
    return {"best": best.value, "last": ordered[-1].value, "best_step": best.step}


# --- tracking access -------------------------------------------------------------------------------------------
def _check_sqlite(uri: str) -> None:
    """An SQLite URI must name an existing file: MLflow would silently create an empty store."""
    path = sqlite_database_path(uri)
    if path is not None and not path.is_file():
        raise CompareError(f"no MLflow database at {path} (tracking URI {uri}); run a recipe first")


def _experiments(client: Any, name: str | None) -> list[Any]:
    if name is not None:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            known = sorted(e.name for e in client.search_experiments())
            raise CompareError(
                f"experiment {name!r} not found at {client.tracking_uri}; known: {', '.join(known) or 'none'}"
            )
        return [exp]
    return list(client.search_experiments())


def _search_runs(client: Any, experiments: list[Any], stage: str, max_runs: int) -> tuple[list[Any], int]:
    """The newest ``max_runs`` matching runs, and how many more match (left out)."""
    filter_string = "" if stage == "all" else f"tags.\"{STAGE_TAG}\" = '{stage}'"
    ids = [e.experiment_id for e in experiments]
    order = ["attributes.start_time DESC"]
    page = client.search_runs(ids, filter_string=filter_string, max_results=max_runs, order_by=order)
    left_out, token = 0, page.token
    while token:  # count the rest, a page at a time
        more = client.search_runs(ids, filter_string=filter_string, max_results=1000, page_token=token)
        left_out += len(more)
        token = more.token
    return list(page), left_out


def monitor_from_config(client: Any, run_id: str) -> str | None:
    """The monitored metric recorded in a run's ``config.yaml`` artifact, or None."""
    import yaml

    quiet = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ
    if quiet:
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run_id, "config.yaml", tmp)
            config = yaml.safe_load(Path(path).read_text())
    except Exception:  # no artifact, unreadable yaml, artifact store unreachable: fall back
        return None
    finally:
        if quiet:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
    model = (config or {}).get("model") or {}
    if not isinstance(model, dict):
        return None
    monitor = (model.get("init_args") or {}).get("monitor")
    if monitor:
        return str(monitor)
    class_path = model.get("class_path")
    return default_monitor_of(class_path) if isinstance(class_path, str) else None


def default_monitor_of(class_path: str) -> str | None:
    """The ``default_monitor`` of the task a run's ``config.yaml`` names, or None.

    A run's artifacts are data: ``class_path`` is compared, as text, with the tasks of ``lightning_modules`` and the
    other ``Task`` subclasses already imported in this process; nothing it names is ever imported.
    """
    from lightning_modules import Task  # noqa: PLC0415  (loopwise's own tasks, slow to import: only when needed)

    for cls in task_classes(Task):
        names = {f"{cls.__module__}.{cls.__qualname__}"}
        if cls.__module__.startswith("lightning_modules."):
            names.add(f"lightning_modules.{cls.__qualname__}")  # the short path the package exports
        if class_path in names:
            default = getattr(cls, "default_monitor", None)
            return str(default) if default else None
    return None


def task_classes(base: type) -> list[type]:
    """``base`` and its subclasses imported so far, at any depth."""
    found, pending = [base], list(base.__subclasses__())
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return found


def choose_metric(client: Any, runs: list[Any], requested: str | None) -> str:
    """``requested`` if given, else the monitored metric of the newest run with a config, else ``val/loss``."""
    logged = set().union(*(r.data.metrics.keys() for r in runs)) if runs else set()
    if requested:
        if requested not in logged:
            raise CompareError(
                f"metric {requested!r} was not logged by any listed run; logged: {', '.join(sorted(logged)) or 'none'}"
            )
        return requested
    candidates: list[str] = []
    for run in runs[:3]:  # newest first; a config download per run, so look at a few only
        monitor = monitor_from_config(client, run.info.run_id)
        if monitor:
            candidates.append(monitor)
            break
    candidates.append(FALLBACK_METRIC)
    for name in candidates:
        if name in logged:
            return name
    raise CompareError(
        f"none of {', '.join(candidates)} was logged by the listed runs; pick one with --metric "
        f"(logged: {', '.join(sorted(logged)) or 'none'})"
    )


# --- rows ------------------------------------------------------------------------------------------------------
def _iso(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _duration(run: Any) -> float | None:
    if run.info.start_time and run.info.end_time:
        return round((run.info.end_time - run.info.start_time) / 1000, 1)
    return None


def differing_params(runs: list[Any]) -> list[str]:
    """Param names whose values are not the same in every run (sorted)."""
    keys = sorted(set().union(*(r.data.params.keys() for r in runs))) if runs else []
    return [k for k in keys if len({r.data.params.get(k) for r in runs}) > 1]


def _epoch_at(client: Any, run_id: str, step: int | None) -> int | None:
    if step is None:
        return None
    try:
        epochs = client.get_metric_history(run_id, "epoch")
    except Exception:
        return None
    at = [m.value for m in epochs if m.step == step]
    return int(at[-1]) if at else None


def build_rows(client: Any, runs: list[Any], metric: str, experiment_names: dict[str, str]) -> tuple[
    list[dict[str, Any]], list[str], dict[str, list[Any]]
]:
    """One dict per run (keys = column names), the differing param names, and each run's metric history."""
    params = differing_params(runs)
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[Any]] = {}
    for run in runs:
        run_id = run.info.run_id
        history = client.get_metric_history(run_id, metric) if metric in run.data.metrics else []
        histories[run_id] = history
        summary = summarize_history(history, metric)
        row: dict[str, Any] = {
            "run": run.info.run_name or "",
            "id": run_id,
            "experiment": experiment_names.get(run.info.experiment_id, run.info.experiment_id),
            "status": run.info.status,
            "start": _iso(run.info.start_time),
            "duration (s)": _duration(run),
        }
        for key in params:
            row[key] = run.data.params.get(key)
        row[f"{metric} best"] = summary["best"]
        row[f"{metric} last"] = summary["last"]
        row["best step"] = summary["best_step"]
        row["best epoch"] = _epoch_at(client, run_id, summary["best_step"])
        rows.append(row)
    return rows, params, histories


# --- output ----------------------------------------------------------------------------------------------------
def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.6g}"
    return str(value)


def format_table(rows: list[dict[str, Any]], params: list[str]) -> str:
    """A plain aligned text table; at most ``MAX_PARAM_COLUMNS`` param columns, the rest named below."""
    shown, hidden = params[:MAX_PARAM_COLUMNS], params[MAX_PARAM_COLUMNS:]
    columns = [c for c in rows[0] if c not in hidden]
    cells = [[_cell(r[c][:8] if c == "id" else r[c]) for c in columns] for r in rows]
    numeric = [all(isinstance(r[c], (int, float)) or r[c] is None for r in rows) for c in columns]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]

    def line(values: list[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)]
        return "  ".join(parts).rstrip()

    out = [line(columns), "  ".join("-" * w for w in widths)]
    out += [line(row) for row in cells]
    if hidden:
        out.append(f"(+{len(hidden)} more differing params not shown: {', '.join(hidden)}; see --format csv/json)")
    if not shown:
        out.append("(no params differ between these runs)" if len(rows) > 1 else "(one run: no params to compare)")
    return "\n".join(out) + "\n"


def format_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def format_json(rows: list[dict[str, Any]]) -> str:
    return json.dumps(rows, indent=2) + "\n"


def plot_curves(runs: list[Any], histories: dict[str, list[Any]], metric: str, path: str | Path) -> Any:
    """Save a PNG of ``metric`` against step, one line per run; returns the matplotlib ``Figure``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for run in runs:
        history = sorted(histories.get(run.info.run_id, []), key=lambda m: (m.step, m.timestamp))
        if not history:
            continue
        label = f"{run.info.run_name or 'run'} ({run.info.run_id[:8]})"
        ax.plot([m.step for m in history], [m.value for m in history], marker="." if len(history) < 50 else None,
                label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} ({'lower' if lower_is_better(metric) else 'higher'} is better)")
    ax.grid(True, alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return fig


# --- CLI -------------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Compare MLflow runs: differing params and the best/last value of one metric.",
    )
    parser.add_argument("--experiment", metavar="NAME", help="experiment name (default: every experiment)")
    parser.add_argument(
        "--metric", metavar="NAME", help="metric to compare (default: the recipe's monitored metric, else val/loss)"
    )
    parser.add_argument(
        "--tracking-uri", metavar="URI", help="MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)"
    )
    parser.add_argument("--stage", choices=STAGES, default="fit", help="runs of this stage only (default: fit)")
    parser.add_argument("--format", choices=("table", "csv", "json"), default="table", help="output format")
    parser.add_argument("--plot", metavar="PATH", help="also write a PNG of the metric's curves to PATH")
    parser.add_argument("--max-runs", metavar="N", type=int, default=50, help="newest N runs (default: 50)")
    parser.add_argument("--sweep", metavar="RUN_OR_STUDY", help="the trials of a sweep (parent run id or study name)")
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``recipes compare``; ``argv`` excludes the word ``compare``. Returns the exit code."""
    args = build_parser().parse_args(argv)
    if args.max_runs < 1:
        return _error("--max-runs must be at least 1")
    uri = args.tracking_uri or default_tracking_uri()
    try:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient
        from requests.exceptions import RequestException
    except ImportError as err:  # pragma: no cover - mlflow is a dependency
        return _error(f"mlflow is required: {err}")

    try:
        _check_sqlite(uri)
        with fast_http_failures(uri):
            client = MlflowClient(tracking_uri=uri)
            if args.sweep:
                from recipes.compare_sweep import show_sweep

                return show_sweep(client, args)
            experiments = _experiments(client, args.experiment)
            runs, left_out = _search_runs(client, experiments, args.stage, args.max_runs) if experiments else ([], 0)
            if not runs:
                where = f"experiment {args.experiment!r}" if args.experiment else "any experiment"
                stage = "" if args.stage == "all" else f" with stage {args.stage!r} (try --stage all)"
                raise CompareError(f"no runs in {where}{stage} at {uri}")
            metric = choose_metric(client, runs, args.metric)
            names = {e.experiment_id: e.name for e in experiments}
            rows, params, histories = build_rows(client, runs, metric, names)
    except CompareError as err:
        return _error(str(err))
    except (MlflowException, RequestException, ConnectionError, OSError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if len(first) > 300:
            first = first[:297] + "..."
        return _error(f"cannot read the tracking store at {uri}: {first}")

    if left_out:
        print(
            f"compare: showing the newest {len(runs)} of {len(runs) + left_out} matching runs; {left_out} left out "
            f"(--max-runs {args.max_runs})",
            file=sys.stderr,
        )
    if args.format == "csv":
        text = format_csv(rows)
    elif args.format == "json":
        text = format_json(rows)
    else:
        text = format_table(rows, params)
    sys.stdout.write(text)

    if args.plot:
        try:
            plot_curves(runs, histories, metric, args.plot)
        except OSError as err:
            return _error(f"cannot write the plot {args.plot}: {err}")
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
