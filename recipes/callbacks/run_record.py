"""One durable record per run: the resolved config, curated params and tags, in the MLflow run."""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.cli import SaveConfigCallback

from datamodules.recipe_contract import batch_size_of, data_size, split_sizes_of
from lightning_modules.recipe_contract import network_of, schedule_of
from recipes.tracking.tracked_run import tracked_run


def curated_params(trainer: pl.Trainer, module: pl.LightningModule, seed: Any) -> dict[str, Any]:
    """The flat parameters that identify a training run (values as MLflow will show them)."""
    datamodule = trainer.datamodule
    params: dict[str, Any] = {
        "task": type(module).__name__,
        "network": type(network_of(module)).__name__,
        "data": type(datamodule).__name__ if datamodule is not None else None,
        "seed": seed,
        "precision": trainer.precision,
        "devices": trainer.world_size,
        "accumulate_grad_batches": trainer.accumulate_grad_batches,
        "gradient_clip_val": trainer.gradient_clip_val,
        "max_epochs": trainer.max_epochs,
        "max_steps": trainer.max_steps,
    }
    if trainer.optimizers:
        optimizer = trainer.optimizers[0]
        params["optimizer"] = type(optimizer).__name__
        params["lr"] = optimizer.defaults.get("lr")
        params["weight_decay"] = optimizer.defaults.get("weight_decay")
    schedule = schedule_of(module)
    if schedule is not None:
        params["schedule"] = type(schedule).__name__
        describe = getattr(schedule, "describe", None)
        for key, value in (describe() if callable(describe) else {}).items():
            params[f"schedule.{key}"] = value
    batch_size = batch_size_of(datamodule)
    if batch_size is not None:
        params["batch_size"] = batch_size
        params["effective_batch_size"] = batch_size * trainer.accumulate_grad_batches * trainer.world_size
    steps = trainer.estimated_stepping_batches
    params["total_optimizer_steps"] = steps if not math.isinf(steps) else "unbounded"
    for split, size in split_sizes_of(datamodule).items():
        params[f"{split}_samples"] = size
    for name in ("num_classes", "in_features"):
        value = data_size(datamodule, name)
        if value is not None:
            params[name] = value
    return params


class RunRecord(SaveConfigCallback):
    """Replaces LightningCLI's ``SaveConfigCallback`` (which asserts under MLflow, having no log_dir).

    Logs the full resolved config as the run artifact ``config.yaml`` and, when training starts, the curated
    params of ``curated_params``. Params are logged once per run: MLflow refuses a changed value.
    """

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        run = tracked_run(trainer)
        if run is None:
            return
        text = self.parser.dump(self.config, skip_none=False)
        run.log_text(text, self.config_filename)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = tracked_run(trainer)
        if run is None or not trainer.is_global_zero:
            return
        run.log_params_once(curated_params(trainer, pl_module, self.config.get("seed_everything")))
