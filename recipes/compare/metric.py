"""The metric ``recipes compare`` ranks runs by: which one, which way is better, its best and last values.

* Which: ``--metric``, else the monitored metric of the newest listed run that has a ``config.yaml`` artifact
  (``model.init_args.monitor``, else the ``default_monitor`` of ``model.class_path``), else ``val/loss``; the first
  of these that a listed run has logged. Each experiment's table chooses its own. ``config.yaml`` is read as data
  (``yaml.safe_load``): ``model.class_path`` is compared as text with loopwise's tasks (and ``Task`` subclasses
  already imported), never imported, so a run's artifact never chooses what code runs.
* An evaluation run logs the metric under its own split: a ``test`` run's value for ``val/acc`` is its ``test/acc``
  (``metric_of_run``), so ``--stage all`` puts test scores beside the fit runs' validation scores.
* Best = min for names ending in loss/error/mae/mse/rmse/perplexity/ppl, else max; ties go to the earliest step.
  "Last" is the value at the highest step.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from recipes.compare.errors import CompareError
from recipes.compare.runs import run_stage

LOWER_IS_BETTER = ("loss", "error", "mae", "mse", "rmse", "perplexity", "ppl")
FALLBACK_METRIC = "val/loss"
SPLIT_OF_STAGE = {"validate": "val", "test": "test", "predict": "predict"}
CONFIGS_READ = 3


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


def metric_of_run(metric: str, run: Any) -> str:
    """The name under which ``run`` logged ``metric``: its own split's for an evaluation run (``test/acc``)."""
    if metric in run.data.metrics or "/" not in metric:
        return metric
    split = SPLIT_OF_STAGE.get(run_stage(run))
    own = f"{split}/{metric.split('/', 1)[1]}" if split else metric
    return own if own in run.data.metrics else metric


def monitor_from_config(client: Any, run_id: str) -> str | None:
    """The monitored metric recorded in a run's ``config.yaml`` artifact, or None."""
    import yaml  # noqa: PLC0415

    quiet = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR" not in os.environ
    if quiet:
        os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = client.download_artifacts(run_id, "config.yaml", tmp)
            config = yaml.safe_load(Path(path).read_text())
    except Exception:  # noqa: BLE001 - no artifact, unreadable yaml, artifact store unreachable: fall back
        return None
    finally:
        if quiet:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
    model = (config or {}).get("model") if isinstance(config, dict) else None
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
    from lightning_modules.recipe_contract import default_monitor_of as contract_default_monitor  # noqa: PLC0415

    for cls in task_classes(Task):
        names = {f"{cls.__module__}.{cls.__qualname__}"}
        if cls.__module__.startswith("lightning_modules."):
            names.add(f"lightning_modules.{cls.__qualname__}")  # the short path the package exports
        if class_path in names:
            default = contract_default_monitor(cls, None)
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


def logged_by(runs: list[Any], metric: str) -> bool:
    """True when a listed run logged ``metric`` (an evaluation run: under its own split)."""
    return any(metric_of_run(metric, run) in run.data.metrics for run in runs)


def choose_metric(client: Any, runs: list[Any], requested: str | None) -> str:
    """``requested`` if given, else the monitored metric of the newest run with a config, else ``val/loss``."""
    logged = sorted(set().union(*(r.data.metrics.keys() for r in runs))) if runs else []
    if requested:
        if not logged_by(runs, requested):
            raise CompareError(
                f"metric {requested!r} was not logged by any listed run; logged: {', '.join(logged) or 'none'}"
            )
        return requested
    candidates: list[str] = []
    for run in runs[:CONFIGS_READ]:  # newest first; a config download per run, so look at a few only
        monitor = monitor_from_config(client, run.info.run_id)
        if monitor:
            candidates.append(monitor)
            break
    candidates.append(FALLBACK_METRIC)
    for name in candidates:
        if logged_by(runs, name):
            return name
    raise CompareError(
        f"none of {', '.join(candidates)} was logged by the listed runs; pick one with --metric "
        f"(logged: {', '.join(logged) or 'none'})"
    )


__all__ = ["FALLBACK_METRIC", "choose_metric", "default_monitor_of", "logged_by", "lower_is_better",
           "metric_of_run", "monitor_from_config", "summarize_history", "task_classes"]
