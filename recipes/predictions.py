"""``recipes predict`` output: one CSV row per sample, also logged to the MLflow run."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from recipes.tracking import find_mlflow_logger


class PredictionCsvWriter(BasePredictionWriter):
    """Write the module's ``predict_step`` outputs to ``path`` as CSV (``output`` or ``output_0..k`` columns).

    Args:
        path: CSV file to write; an existing file is never overwritten (a numbered name is used instead).
    """

    def __init__(self, path: str | Path) -> None:
        super().__init__(write_interval="epoch")
        self.path = Path(path)
        self.written: Path | None = None

    def write_on_epoch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        predictions: Sequence[Any],
        batch_indices: Sequence[Any] | None,
    ) -> None:
        if not trainer.is_global_zero:
            return
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        outputs = torch.cat([torch.as_tensor(b).detach().cpu().reshape(len(b), -1) for b in batches])
        target = self.path
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.stem}-{n}{self.path.suffix}")
            n += 1
        target.parent.mkdir(parents=True, exist_ok=True)
        header = ["output"] if outputs.shape[1] == 1 else [f"output_{i}" for i in range(outputs.shape[1])]
        with target.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(outputs.tolist())
        self.written = target
        print(f"predictions: {len(outputs)} rows -> {target}")
        logger = find_mlflow_logger(trainer.loggers)
        if logger is not None:
            logger.experiment.log_artifact(logger.run_id, str(target), "predictions")
