"""``recipes compare --sweep <parent run id or study name>``: the trials of a sweep, best first.

One row per trial (a child run of the sweep's parent run): its number, state (COMPLETE, PRUNED, FAILED, KILLED,
RUNNING), the objective (the best value of the sweep's metric over the trial's validations, in the sweep's
direction), the swept values as columns, and the run id. ``--plot PATH`` draws the objective per trial (with the
best so far) and per swept parameter (a log axis where the sweep sampled on one).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

from jsonargparse import Namespace

from recipes.compare.errors import CompareError
from recipes.compare.table import format_csv, format_json, format_table


def find_parent(client: Any, reference: str, experiment: str | None) -> Any:
    """The sweep's parent run: a run id, or the study name (the newest parent run of that study)."""
    try:
        run = client.get_run(reference)
        if run.data.tags.get("loopwise.sweep.role") == "parent":
            return run
        raise CompareError(f"run {reference} is not a sweep's parent run (tag loopwise.sweep.role)")
    except CompareError:
        raise
    except Exception:  # noqa: BLE001 - not a run id: a study name
        pass
    experiments = client.search_experiments()
    ids = [e.experiment_id for e in experiments if experiment is None or e.name == experiment]
    runs = client.search_runs(ids, filter_string=(
        f"tags.`loopwise.sweep.role` = 'parent' and tags.`loopwise.sweep.study` = '{reference}'"),
        order_by=["attributes.start_time DESC"], max_results=1) if ids else []
    if not runs:
        raise CompareError(f"no sweep with parent run id or study name {reference!r}")
    return runs[0]


def trial_state(run: Any) -> str:
    tags = run.data.tags
    if "loopwise.sweep.pruned" in tags:
        return "PRUNED"
    if "loopwise.sweep.failure" in tags:
        return "FAILED"
    return {"FINISHED": "COMPLETE"}.get(run.info.status, run.info.status)


def sweep_rows(client: Any, parent: Any) -> tuple[list[dict[str, Any]], list[str], str, str]:
    """(rows best first, swept keys, metric, direction) of the parent's trials."""
    metric = parent.data.params.get("sweep.metric", "val/loss")
    direction = parent.data.params.get("sweep.direction", "minimize")
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'", max_results=10000)
    rows: list[dict[str, Any]] = []
    keys: list[str] = []
    for run in children:
        params = json.loads(run.data.tags.get("loopwise.sweep.params", "{}"))
        keys += [k for k in params if k not in keys]
        values = [m.value for m in client.get_metric_history(run.info.run_id, metric) if math.isfinite(m.value)]
        objective = (max(values) if direction == "maximize" else min(values)) if values else None
        rows.append({"trial": int(run.data.tags.get("loopwise.sweep.trial", -1)), "state": trial_state(run),
                     metric: objective, **params, "id": run.info.run_id})
    sign = -1.0 if direction == "maximize" else 1.0
    rows.sort(key=lambda r: (r[metric] is None, sign * (r[metric] or 0.0), r["trial"]))
    for row in rows:
        for key in keys:
            row.setdefault(key, None)
            if isinstance(row[key], (list, dict)):
                row[key] = json.dumps(row[key])
        row["id"] = row.pop("id")
    return rows, keys, metric, direction


def log_scaled(client: Any, parent: Any) -> set[str]:
    """The swept keys the sweep sampled on a log scale (from the parent's ``search_space.json``)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            space = json.loads(Path(client.download_artifacts(parent.info.run_id, "search_space.json", tmp)).read_text())
    except Exception:  # noqa: BLE001 - an older parent without the artifact: linear axes
        return set()
    return {key for key, spec in space.items() if spec.get("log")}


def plot_sweep(rows: list[dict[str, Any]], keys: list[str], metric: str, direction: str, log_keys: set[str],
               path: str | Path) -> Any:
    """A PNG: the objective per trial with the best so far, then the objective against each swept value."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    panels = 1 + len(keys)
    fig = Figure(figsize=(4.5 * min(panels, 3), 3.8 * math.ceil(panels / 3)), dpi=100)
    FigureCanvasAgg(fig)
    done = sorted((r for r in rows if r[metric] is not None), key=lambda r: r["trial"])
    ax = fig.add_subplot(math.ceil(panels / 3), min(panels, 3), 1)
    colors = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange"}
    ax.scatter([r["trial"] for r in done], [r[metric] for r in done], c=[colors.get(r["state"], "tab:red") for r in done])
    best: list[float] = []
    for r in done:
        value = r[metric]
        best.append(value if not best else (max if direction == "maximize" else min)(best[-1], value))
    ax.step([r["trial"] for r in done], best, where="post", color="black", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} per trial ({direction}; orange: pruned)", fontsize="small")
    ax.legend(fontsize="small")
    for i, key in enumerate(keys, start=2):
        ax = fig.add_subplot(math.ceil(panels / 3), min(panels, 3), i)
        points = [(r[key], r[metric]) for r in done if r[key] is not None]
        numeric = all(isinstance(x, (int, float)) for x, _ in points)
        xs = [x if numeric else str(x) for x, _ in points]
        ax.scatter(xs, [y for _, y in points])
        if numeric and key in log_keys:
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(NullFormatter())  # labels at every minor tick of a narrow range overlap
        ax.set_xlabel(key.replace(".init_args", ""), fontsize="small")
        ax.set_ylabel(metric)
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return fig


def show_sweep(client: Any, args: Namespace) -> int:
    """``--sweep``: the sweep's trials, best first, as a table, CSV or JSON; ``--plot`` per trial and per value."""
    parent = find_parent(client, args.sweep, args.experiment)
    rows, keys, metric, direction = sweep_rows(client, parent)
    if not rows:
        raise CompareError(f"sweep {args.sweep!r} has no trials yet")
    formats = {"csv": format_csv, "json": format_json}
    sys.stdout.write(formats[args.format](rows) if args.format in formats else format_table(rows, keys))
    if args.plot:
        plot_sweep(rows, keys, metric, direction, log_scaled(client, parent), args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


__all__ = ["show_sweep", "find_parent", "log_scaled", "plot_sweep", "sweep_rows", "trial_state"]
