"""The objective of ``recipes sweep``: which metric the study optimizes, and in which direction."""

from __future__ import annotations

from jsonargparse import Namespace

from lightning_modules.recipe_contract import default_monitor_of
from lightning_modules.task import Task
from recipes.run.data_sizes import class_at
from recipes.sweep.space import SweepFile


def objective_of(cfg: Namespace, options: Namespace, sweep: SweepFile) -> tuple[str, str]:
    """(metric, direction) of the sweep: the options, else the sweep file, else the task's monitor and its mode."""
    task = class_at(cfg, "model")
    monitor = cfg.get("model.init_args.monitor") or default_monitor_of(task)
    metric = options.metric or sweep.metric or monitor
    direction = options.direction or sweep.direction
    if direction is None:
        mode = cfg.get("model.init_args.monitor_mode") if metric == monitor else None
        direction = "maximize" if (mode or Task.mode_for(metric)) == "max" else "minimize"
    return metric, direction


__all__ = ["objective_of"]
