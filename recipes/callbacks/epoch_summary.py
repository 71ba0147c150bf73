"""Progress for logs that are not a terminal: one line per epoch instead of a flood of bar redraws."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback


def format_metrics(metrics: dict[str, object]) -> str:
    """``name value`` pairs of scalar metrics, sorted, 4 significant digits."""
    parts = []
    for name in sorted(metrics):
        value = metrics[name]
        try:
            parts.append(f"{name} {float(value):.4g}")  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    return "  ".join(parts)


class EpochSummary(Callback):
    """Print ``epoch N/M  train/loss ...  val/acc ...`` once per epoch (used when stdout is not a TTY)."""

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking:
            return
        total = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else "?"
        metrics = {k: v for k, v in trainer.callback_metrics.items() if "/" in k}
        print(f"epoch {trainer.current_epoch + 1}/{total}  step {trainer.global_step}  {format_metrics(metrics)}")
