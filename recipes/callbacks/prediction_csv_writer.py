"""``PredictionCsvWriter``: ``recipes predict`` output, one CSV row per sample, also logged to the MLflow run."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import BasePredictionWriter

from recipes.predict.predictions import gather_in_sample_order, prediction_table
from recipes.tracking.tracked_run import tracked_run


class PredictionCsvWriter(BasePredictionWriter):
    """Write the module's predictions to ``path`` as CSV: one row per sample in the order of the data, an id
    column (``row``: the sample's row in its file, from 0; ``path`` for image files), then the task's
    ``prediction_columns``: ``prediction`` (class name, or value in target units) and ``prob_<class>`` per class.

    Under DDP every rank predicts its own share of the samples: rank 0 gathers them all and writes one row per
    sample in the order of the data set (by the sample indices Lightning records).

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
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        rows = [torch.as_tensor(b).detach().cpu().reshape(len(b), -1) for b in batches]
        outputs = torch.cat(rows) if rows else None
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            outputs = gather_in_sample_order(outputs, batch_indices)  # a collective: every rank takes part
        if not trainer.is_global_zero or outputs is None:
            return
        target = self.path
        n = 1
        while target.exists():
            target = self.path.with_name(f"{self.path.stem}-{n}{self.path.suffix}")
            n += 1
        target.parent.mkdir(parents=True, exist_ok=True)
        header, rows = prediction_table(pl_module, trainer.datamodule, outputs)
        with target.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(header)
            writer.writerows(rows)
        self.written = target
        print(f"predictions: {len(outputs)} rows -> {target}")
        run = tracked_run(trainer)
        if run is not None:
            run.log_file(str(target), "predictions")


__all__ = ["PredictionCsvWriter"]
