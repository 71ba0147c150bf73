"""One trial of ``recipes sweep``: what its recipe fit needs to know about it, and what the fit reports back.

``recipes.sweep.runner`` runs every trial as an ordinary ``recipes fit`` in the same process, through
``recipes.sweep.trial_cli.TrialCLI``, a ``RecipesCLI`` built with the trial's ``ActiveTrial``: its run's tags
(``mlflow.parentRunId`` nests the trial's MLflow run under the sweep's parent run) and the ``TrialPruning`` callback
(``recipes.callbacks.trial_pruning``), which reports each validation's value here (``record``) and the pruner's stop
(``mark_pruned``). Its swept values become params of its run (``run_params``: ``sweep.<key>``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from recipes.sweep.space import as_cli_value

#: the prefix of the params that hold a trial's swept values; no param a recipe logs starts with it
PARAM_PREFIX = "sweep."


@dataclass(frozen=True)
class RetryOf:
    """The killed trial a retry repeats (its worker died, or SLURM preempted it) and what the retry takes from it."""

    #: the number of the trial that was killed (the one right before this retry, in a chain of retries)
    number: int
    #: its MLflow run, ``None`` when it died before it had one
    run_id: str | None = None
    #: ``--ckpt_path`` of its last checkpoint (``run:<run id>/last``), ``None`` when it left none: the retry
    #: trains on from there, in a run of its own linked to the killed one
    checkpoint: str | None = None
    #: the objective's values the killed trial reported to Optuna, by epoch (the first validation of each): those
    #: before the checkpoint's epoch are the retry's too, for the pruner
    reported: dict[int, float] = field(default_factory=dict)
    #: the objective's history in the killed run, (global step, value) of every validation: those before the
    #: checkpoint's step count toward the retry's objective, as they would have in a run never killed
    history: list[tuple[int, float]] = field(default_factory=list)


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
    #: for a retry of a trial whose worker died or was preempted: that trial, its run and last checkpoint
    retry_of: RetryOf | None = None

    def record(self, value: float) -> None:
        """Keep the objective metric of one more validation (rank 0)."""
        self.values.append(value)

    def reported_through(self, epoch: int) -> list[tuple[int, float]]:
        """(epoch, value) the killed trial this one retries reported to Optuna (the first validation of each epoch)
        for the epochs up to ``epoch``, the one the retry's training resumes in from that trial's checkpoint (its
        first validation may be before the checkpoint, in the middle of the epoch or at its end; where it came after,
        an exact resume reports the same value); none for a new trial or a retry from scratch."""
        if self.retry_of is None or self.retry_of.checkpoint is None:
            return []
        return sorted((step, value) for step, value in self.retry_of.reported.items() if step <= epoch)

    def validated_before(self, step: int) -> list[float]:
        """The objective's values of every validation of the killed trial before global step ``step`` (the
        checkpoint's: a validation logs at the step before the checkpoint it leads to), from its run's history; none
        for a new trial or a retry from scratch."""
        if self.retry_of is None or self.retry_of.checkpoint is None:
            return []
        return [value for at, value in self.retry_of.history if at < step]

    def mark_pruned(self, where: str) -> None:
        """The pruner stopped the trial after a validation; ``where`` says which (``"epoch 3: val/acc 0.71"``)."""
        self.pruned_at = where

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

    def run_params(self) -> dict[str, str]:
        """Params of the trial's MLflow run: each swept value as ``sweep.<key>``, the key as the sweep file and
        ``recipes fit --<key>`` name it, the value as the fit's command line gets it (lists and mappings as JSON).

        The prefix keeps them apart from the recipe's own params (``lr``, ``batch_size``, ``data``, ``init_from.*``
        ...): MLflow refuses a second value for a logged param, so a swept key that a recipe param shares would
        fail the trial; and it tells which params the sweep chose.
        """
        return {f"{PARAM_PREFIX}{key}": as_cli_value(value) for key, value in self.params.items()}

    def tags(self) -> dict[str, str]:
        """Tags of the trial's MLflow run."""
        tags = {
            "loopwise.sweep.study": self.study_name,
            "loopwise.sweep.trial": str(self.number),
            "loopwise.sweep.params": json.dumps(self.params, sort_keys=True),
        }
        if self.parent_run_id:
            tags["mlflow.parentRunId"] = self.parent_run_id
        if self.retry_of is not None:  # the killed trial this one repeats, and its run
            tags["loopwise.sweep.retry_of_trial"] = str(self.retry_of.number)
            if self.retry_of.run_id:
                tags["loopwise.sweep.retry_of_run"] = self.retry_of.run_id
        return tags


__all__ = ["ActiveTrial", "RetryOf"]
