"""The confusion matrix of a classification run as a PNG artifact of its MLflow run."""

from __future__ import annotations

from typing import Any, Sequence

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from datamodules.recipe_contract import class_names_of
from lightning_modules.recipe_contract import confusion_matrices_of
from recipes.tracking.tracked_run import tracked_run


def confusion_figure(matrix: Tensor, class_names: Sequence[str] | None = None, title: str = "") -> Any:
    """A matplotlib figure of ``matrix`` (rows: true class, columns: predicted class) with counts in the cells."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    values = matrix.cpu().numpy()
    k = values.shape[0]
    names = list(class_names) if class_names is not None and len(class_names) == k else [str(i) for i in range(k)]
    size = min(2.0 + 0.5 * k, 14.0)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(values, cmap="Blues")
    ax.set_xticks(range(k), names, rotation=45, ha="right")
    ax.set_yticks(range(k), names)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    if k <= 30:
        peak = values.max() if values.size else 0
        for i in range(k):
            for j in range(k):
                ax.text(j, i, str(int(values[i, j])), ha="center", va="center",
                        color="white" if values[i, j] > peak / 2 else "black", fontsize=8)
    fig.tight_layout()
    return fig


class ConfusionMatrixArtifact(Callback):
    """Log ``confusion_matrix_val.png`` (after fit's last validation, or a ``validate`` run) and
    ``confusion_matrix_test.png`` to the MLflow run, from the module's ``last_confusion_matrix``."""

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        matrices = confusion_matrices_of(pl_module)
        run = tracked_run(trainer)
        if not matrices or stage not in matrices or run is None or not trainer.is_global_zero:
            return
        import matplotlib.pyplot as plt

        names = class_names_of(trainer.datamodule)
        fig = confusion_figure(matrices[stage], names, f"{stage}, epoch {trainer.current_epoch}")
        try:
            run.log_figure(fig, f"confusion_matrix_{stage}.png")
        finally:
            plt.close(fig)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(trainer, pl_module, "val")

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "validate":
            self._log(trainer, pl_module, "val")

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log(trainer, pl_module, "test")
