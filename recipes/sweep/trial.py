"""One trial of ``recipes sweep`` inside a recipe fit: what the fit needs to know about it, and its pruning callback.

``recipes.sweep.command`` runs every trial as an ordinary ``recipes fit`` in the same process, inside ``running_trial``.
While a trial runs, ``active_trial()`` tells the recipe's parts about it: the run's tags (``mlflow.parentRunId``
nests the trial's MLflow run under the sweep's parent run) and the ``TrialPruning`` callback the recipe adds
(``recipes.sweep.pruning``, imported only in a sweep: Optuna is not loaded by other commands).
"""

from __future__ import annotations

import contextvars
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any



@dataclass
class ActiveTrial:
    """The trial a recipe fit is running for.

    ``trial`` is the ``optuna.Trial`` (``None`` on DDP ranks other than 0, which never talk to the study).
    """

    trial: Any
    number: int
    study_name: str
    parent_run_id: str | None
    metric: str
    direction: str
    params: dict[str, Any]
    #: the metric after each validation of this trial (rank 0), in order
    values: list[float] = field(default_factory=list)
    #: set when the trial was pruned: "epoch 3: val/acc 0.71"
    pruned_at: str | None = None

    def best_value(self) -> float | None:
        """The best reported value in the sweep's direction (the trial's objective), ``None`` before any."""
        finite = [v for v in self.values if math.isfinite(v)]
        if not finite:
            return None
        return min(finite) if self.direction == "minimize" else max(finite)

    @property
    def run_name(self) -> str:
        """The MLflow run name of the trial's fit."""
        return f"{self.study_name}-trial-{self.number}"

    def tags(self) -> dict[str, str]:
        """Tags of the trial's MLflow run."""
        tags = {
            "loopwise.sweep.study": self.study_name,
            "loopwise.sweep.trial": str(self.number),
            "loopwise.sweep.params": json.dumps(self.params, sort_keys=True),
        }
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        return tags


ACTIVE: contextvars.ContextVar[ActiveTrial | None] = contextvars.ContextVar("loopwise_sweep_trial", default=None)


def active_trial() -> ActiveTrial | None:
    """The trial the current recipe fit runs for, or ``None`` outside a sweep."""
    return ACTIVE.get()


@contextmanager
def running_trial(trial: ActiveTrial) -> Iterator[ActiveTrial]:
    """Make ``trial`` the active one while a recipe fit runs for it."""
    token = ACTIVE.set(trial)
    try:
        yield trial
    finally:
        ACTIVE.reset(token)


__all__ = ["ACTIVE", "ActiveTrial", "active_trial", "running_trial"]
