"""``RecipeTrainer``: Lightning's ``Trainer`` whose ``fit``/``validate``/``test``/``predict`` document the checkpoints
a recipe takes.

LightningCLI builds each subcommand's options from the trainer method's signature and docstring, so
``recipes fit --help`` showed Lightning's own ``ckpt_path`` text (``hpc``, the Lightning model registry), which
loopwise does not resolve that way. These methods only pass their arguments on; their docstrings are the help.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch import LightningDataModule, Trainer

CHECKPOINT_FORMS = (
    "``best`` (the best best.ckpt among this recipe's finished fit runs on this data), ``last`` (the newest "
    "last.ckpt of its fit runs), ``run:<run id>/best|last``, ``mlflow:<run id>/best|last`` (a tracked run's "
    "checkpoint artifact, downloaded), or a .ckpt file; read weights-only, and refused with one line when it is "
    "another recipe's. validate/test/predict require it (or the model's init_from); ``none`` evaluates the "
    "untrained network as built, on purpose"
)
"""What ``--ckpt_path`` takes, in each method's help."""


class RecipeTrainer(Trainer):
    """Lightning's Trainer, with its own arguments (devices, precision, epochs, accumulation, clipping, ...).

    The subclass only documents ``--ckpt_path`` the way recipes resolve it; everything else is Lightning's."""

    def fit(
        self,
        model: pl.LightningModule,
        train_dataloaders: Any = None,
        val_dataloaders: Any = None,
        datamodule: LightningDataModule | None = None,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
    ) -> None:
        """Train the recipe's model, or resume a run.

        Args:
            model: The task to train.
            train_dataloaders: Training data (recipes use the data module).
            val_dataloaders: Validation data (recipes use the data module).
            datamodule: The recipe's data module.
            ckpt_path: Resume training from a checkpoint, continuing its MLflow run: weights, optimizer, schedule,
                loop counters and random states come back. One of {forms}.
            weights_only: Left to loopwise: checkpoints are always read weights-only.
        """
        super().fit(model, train_dataloaders, val_dataloaders, datamodule, ckpt_path, weights_only)

    def validate(
        self,
        model: pl.LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: LightningDataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[Any]:
        """Evaluate a checkpoint on the validation split, as a run of its own linked to the fit run.

        Args:
            model: The task to evaluate.
            dataloaders: Validation data (recipes use the data module).
            ckpt_path: The checkpoint to evaluate. One of {forms}.
            verbose: Print the metrics.
            datamodule: The recipe's data module.
            weights_only: Left to loopwise: checkpoints are always read weights-only.
        """
        return super().validate(model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def test(
        self,
        model: pl.LightningModule | None = None,
        dataloaders: Any = None,
        ckpt_path: str | Path | None = None,
        verbose: bool = True,
        datamodule: LightningDataModule | None = None,
        weights_only: bool | None = None,
    ) -> list[Any]:
        """Evaluate a checkpoint on the test split, as a run of its own linked to the fit run.

        Args:
            model: The task to evaluate.
            dataloaders: Test data (recipes use the data module).
            ckpt_path: The checkpoint to test. One of {forms}.
            verbose: Print the metrics.
            datamodule: The recipe's data module.
            weights_only: Left to loopwise: checkpoints are always read weights-only.
        """
        return super().test(model, dataloaders, ckpt_path, verbose, datamodule, weights_only)

    def predict(
        self,
        model: pl.LightningModule | None = None,
        dataloaders: Any = None,
        datamodule: LightningDataModule | None = None,
        return_predictions: bool | None = None,
        ckpt_path: str | Path | None = None,
        weights_only: bool | None = None,
    ) -> Any:
        """Predict with a checkpoint (the test split, or new data with the data module's predict_path) into a CSV.

        Args:
            model: The task to predict with.
            dataloaders: Data to predict (recipes use the data module).
            datamodule: The recipe's data module.
            return_predictions: Keep the predictions in memory as well as writing them.
            ckpt_path: The checkpoint to predict with. One of {forms}.
            weights_only: Left to loopwise: checkpoints are always read weights-only.
        """
        return super().predict(model, dataloaders, datamodule, return_predictions, ckpt_path, weights_only)


def document_checkpoint_forms(trainer_class: type[Trainer]) -> None:
    """Put ``CHECKPOINT_FORMS`` into the ``ckpt_path`` help of each subcommand's method (written once, shown four
    times)."""
    for name in ("fit", "validate", "test", "predict"):
        method = getattr(trainer_class, name)
        method.__doc__ = str(method.__doc__).replace("{forms}", CHECKPOINT_FORMS)


document_checkpoint_forms(RecipeTrainer)
