"""``InitialWeightsRecord``: what a task's ``init_from`` loaded, written to the MLflow run (``init_from.json``, params
``init_from.*``, tag ``loopwise.init_from``), a one-line warning when the starting weights were trained on this run's
validation or test rows (``recipes.callbacks.init_from_overlap``; tag ``loopwise.init_from_overlap``) and, for a task
with a freeze schedule, the trainable parameter count at each epoch start (metric ``trainable_parameters``). The
weights themselves are loaded before anything runs (``recipes.run.initial_weights``)."""

from __future__ import annotations

import json
import sys

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from lightning_modules.recipe_contract import fine_tuning_of, weights_report_of
from recipes.callbacks.init_from_overlap import OVERLAP_TAG, Overlap, init_from_overlap
from recipes.tracking.tracked_run import tracked_run


class InitialWeightsRecord(Callback):
    """Record a task's initial weights and trainable parameters in the MLflow run (see the module docstring)."""

    def __init__(self) -> None:
        self.recorded = False

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fine_tuning = fine_tuning_of(pl_module)
        report = weights_report_of(pl_module)
        if fine_tuning is None or self.recorded or not trainer.is_global_zero:
            return
        self.recorded = True
        if report is not None:
            print(f"recipes: {report.summary()}", flush=True)
        overlap = (init_from_overlap(report.source, report.file, getattr(trainer, "datamodule", None))
                   if report is not None and report.file else None)
        if isinstance(overlap, str):
            print(f"recipes: {overlap}", flush=True)
        elif overlap is not None and overlap.shared:
            print(f"recipes: warning: {overlap.warning()}", file=sys.stderr, flush=True)
        run = tracked_run(trainer)
        if run is not None and isinstance(overlap, Overlap):
            run.set_tag(OVERLAP_TAG, overlap.tag())
        if run is None:
            return
        settings = fine_tuning.describe()
        if settings:
            run.log_params_once({k: v if isinstance(v, (int, float, str)) else json.dumps(v)
                                 for k, v in settings.items()})
        if report is not None:
            run.log_text(json.dumps(report.as_dict(), indent=1), "init_from.json")
            run.log_params_once({"init_from.loaded_tensors": len(report.loaded),
                                 "init_from.missing": len(report.missing),
                                 "init_from.unexpected": len(report.unexpected),
                                 "init_from.mismatched": len(report.mismatched)})
            run.set_tag("loopwise.init_from", report.source)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        fine_tuning = fine_tuning_of(pl_module)
        if fine_tuning is None or fine_tuning.freeze_schedule is None:
            return
        # from the schedule, not requires_grad: the schedule (a model callback) runs its epoch-start hook after this one
        trainable = [t for start, t, _ in fine_tuning.phases() if start <= trainer.current_epoch][-1]
        for logger in trainer.loggers:
            logger.log_metrics({"trainable_parameters": float(trainable)}, step=trainer.global_step)


__all__ = ["InitialWeightsRecord"]
