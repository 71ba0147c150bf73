"""Where a recipe's checkpoints live, and what ``--ckpt_path best|last`` means."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from recipes.tracking import find_mlflow_logger

ALIASES = ("best", "last")


class RunCheckpoint(ModelCheckpoint):
    """One checkpoint file per run that a recipe keeps up to date: ``best.ckpt`` or ``last.ckpt``.

    ``alias="best"`` keeps the checkpoint with the best value of ``monitor``; ``alias="last"`` is rewritten after
    every validation. Two callbacks instead of ``save_last=True`` because since Lightning 2.6 ``save_last`` only
    writes ``last.ckpt`` when a top-k checkpoint is saved at the same step, so with ``save_top_k=1`` it silently
    becomes a copy of the best checkpoint and resuming from it rewinds training.

    Files go to ``<root>/<experiment>/<MLflow run id>/`` (or a timestamp when no MLflow logger is attached), so
    runs never overwrite each other's checkpoints.

    Args:
        root: Directory that holds the checkpoints of every experiment.
        experiment: Experiment name (the recipe's file stem).
        alias: "best" or "last".
        monitor: Metric that defines the best checkpoint (``alias="best"`` only).
        mode: "min" or "max" for ``monitor``.
    """

    def __init__(
        self,
        root: str | Path,
        experiment: str,
        alias: Literal["best", "last"],
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        **kwargs: Any,
    ) -> None:
        if alias not in ALIASES:
            raise ValueError(f"RunCheckpoint: alias must be one of {ALIASES}, got {alias!r}")
        if alias == "best" and not monitor:
            raise ValueError("RunCheckpoint(alias='best') needs the metric to monitor")
        super().__init__(
            filename=alias,
            monitor=monitor if alias == "best" else None,
            mode=mode,
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
            enable_version_counter=False,
            **kwargs,
        )
        self.alias = alias
        self.root = Path(root)
        self.experiment = experiment

    @property
    def state_key(self) -> str:
        return self._generate_state_key(alias=self.alias, monitor=self.monitor, mode=self.mode)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            logger = find_mlflow_logger(trainer.loggers)
            run = logger.run_id if logger is not None else datetime.now().strftime("run-%Y%m%d-%H%M%S")
            self.dirpath = str((self.root / self.experiment / str(run)).resolve())
        super().setup(trainer, pl_module, stage)


def resolve_checkpoint(ckpt_path: str, experiment: str, root: str | Path) -> str:
    """Turn ``best``/``last`` into the newest such file of the experiment; check that a path exists.

    Raises ``FileNotFoundError`` naming what was looked for.
    """
    if ckpt_path in ALIASES:
        base = Path(root) / experiment
        candidates = sorted(base.glob(f"*/{ckpt_path}.ckpt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise FileNotFoundError(
                f"--ckpt_path {ckpt_path}: no {ckpt_path}.ckpt for experiment {experiment!r} under "
                f"{base.resolve()}; run `recipes fit` first or give a checkpoint file"
            )
        return str(candidates[-1].resolve())
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path: checkpoint file not found: {path.resolve()}")
    return str(path.resolve())
