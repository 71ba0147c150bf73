"""The pruning callback of a ``recipes sweep`` trial (imported only while a sweep runs, by
``recipes.sweep.trial_cli``: it loads Optuna; ``recipes.callbacks`` does not import it)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import lightning.pytorch as pl
from optuna_integration import PyTorchLightningPruningCallback


class PrunedTrial(Protocol):
    """What the pruning callback asks of the sweep's trial (``recipes.sweep.trial.ActiveTrial``, which the sweep
    hands it: the callbacks sit below the sweep and do not import it)."""

    trial: Any  # the ``optuna.Trial``; ``None`` on DDP ranks other than 0
    metric: str

    def record(self, value: float) -> None: ...

    def reported_through(self, epoch: int) -> list[tuple[int, float]]: ...

    def validated_before(self, step: int) -> list[float]: ...

    def mark_pruned(self, where: str) -> None: ...


class TrialPruning(PyTorchLightningPruningCallback):
    """optuna-integration's pruning callback, with one decision for all processes and a clean stop.

    After every validation (not the sanity check) the objective metric is recorded; the first of each epoch is
    reported to the trial (the step is the epoch, as for every trial of the study) and the pruner decides.
    optuna-integration raises ``TrialPruned`` inside the loop, which ends the fit as a failure; under DDP it needs the
    trial on every process and a manual ``check_pruned()``. Here rank 0 alone reports and decides, the
    decision is broadcast (``trainer.strategy.broadcast``), and every process stops after this validation as an
    early stop would; the sweep then marks the trial PRUNED and its MLflow run KILLED with the tag
    ``loopwise.sweep.pruned``.
    """

    def __init__(self, active: PrunedTrial) -> None:
        # the parent keeps the trial (``None`` on ranks > 0, which never report) and the monitor
        super().__init__(active.trial, active.metric)
        self.active = active

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.is_ddp_backend = trainer.world_size > 1
        self.took_earlier_values = False
        self.reported_epochs: set[int] = set()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_earlier_values(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.take_earlier_values(trainer)  # a checkpoint already at max_epochs: training never started

    def take_earlier_values(self, trainer: pl.Trainer) -> None:
        """A retry that trains on from a killed trial's checkpoint: that trial's validations before the checkpoint
        (restored once training starts: its global step and epoch) are this trial's too, once, on rank 0. Every one
        of them counts toward the objective (the killed run's history, else the values it reported to Optuna);
        the first of each epoch up to the one it resumes in is reported to Optuna, so that the pruner compares the
        whole run."""
        if self.took_earlier_values or not trainer.is_global_zero:
            return
        self.took_earlier_values = True
        reported = self.active.reported_through(trainer.current_epoch)
        fallback = [value for epoch, value in reported if epoch < trainer.current_epoch]
        for value in self.active.validated_before(trainer.global_step) or fallback:
            self.active.record(value)
        for epoch, value in reported:  # Optuna keeps the first report of a step: the retry's own later ones add none
            self.report(epoch, value)

    def report(self, epoch: int, value: float) -> None:
        """``value`` as the trial's intermediate value of ``epoch`` (rank 0)."""
        self.active.trial.report(value, step=epoch)
        self.reported_epochs.add(epoch)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        prune = False
        if trainer.is_global_zero:
            score = trainer.callback_metrics.get(self.monitor)
            if score is None:
                raise ValueError(
                    f"recipes sweep: the objective {self.monitor!r} was not logged by this validation; choose "
                    f"--metric among {sorted(k for k in trainer.callback_metrics if k.startswith(('val/', 'train/')))}"
                )
            value = float(score)
            self.active.record(value)
            epoch = trainer.current_epoch
            if math.isfinite(value) and epoch not in self.reported_epochs:  # the first of an epoch's validations
                self.report(epoch, value)  # (Optuna ignores, with a warning, a second value at a step)
                prune = self.active.trial.should_prune()
            if prune:
                self.active.mark_pruned(f"epoch {epoch}: {self.monitor} {value:.6g}")
        if self.is_ddp_backend:
            prune = bool(trainer.strategy.broadcast(prune, src=0))
        if prune:
            trainer.should_stop = True


__all__ = ["PrunedTrial", "TrialPruning"]
