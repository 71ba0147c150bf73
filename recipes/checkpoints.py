"""Where a recipe's checkpoints live, and what ``--ckpt_path best|last`` means."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from recipes.tracking import find_mlflow_logger

ALIASES = ("best", "last")


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` that keeps ``best.ckpt`` (by the task's monitored metric) and ``last.ckpt`` per run.

    Files go to ``<root>/<experiment>/<MLflow run id>/`` (or a timestamp when no MLflow logger is attached), so
    runs never overwrite each other's checkpoints.

    Args:
        root: Directory that holds the checkpoints of every experiment.
        experiment: Experiment name (the recipe's file stem).
        monitor: Metric that defines the best checkpoint.
        mode: "min" or "max" for ``monitor``.
    """

    def __init__(self, root: str | Path, experiment: str, monitor: str, mode: str, **kwargs: Any) -> None:
        kwargs.setdefault("filename", "best")
        kwargs.setdefault("save_last", True)
        kwargs.setdefault("save_top_k", 1)
        kwargs.setdefault("auto_insert_metric_name", False)
        super().__init__(monitor=monitor, mode=mode, **kwargs)
        self.root = Path(root)
        self.experiment = experiment

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
