"""The ``leakage`` check: val samples identical to a train sample.

Train and val samples are hashed (``sample_hashing``) at the start of training; the number of val samples identical
(inputs and targets) to a train sample is set as the run tag ``loopwise.val_train_overlap`` and reported when it is
not zero.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.seed import isolate_rng
from torch.utils.data import DataLoader, Dataset, IterableDataset

from datamodules.recipe_contract import SplitDatasets, split_datasets_of
from recipes.doctor.base import DoctorCheck
from recipes.doctor.findings import FindingsReporter
from recipes.doctor.sample_hashing import sample_hashes

#: the run tag holding the number of val samples identical to a train sample
OVERLAP_TAG = "loopwise.val_train_overlap"


def split_datasets(trainer: pl.Trainer) -> tuple[Dataset | None, list[Dataset] | None]:
    """(train dataset, val datasets) of a fit: the data module's ``datasets`` (``SplitDatasets``), else the datasets
    of the trainer's loaders. The train dataset is ``None`` when the train loader is not one ``DataLoader``; the val
    datasets are ``None`` while the val loaders are not loaded yet."""
    datasets = split_datasets_of(trainer.datamodule)
    if isinstance(datasets, Mapping) and datasets.get("train") is not None and datasets.get("val") is not None:
        return datasets["train"], [datasets["val"]]
    train_loader = trainer.train_dataloader
    train = train_loader.dataset if isinstance(train_loader, DataLoader) else None
    val_loaders: Any = trainer.val_dataloaders
    if val_loaders is None:
        return train, None
    if isinstance(val_loaders, Mapping):
        loaders = list(val_loaders.values())
    else:
        loaders = list(val_loaders) if isinstance(val_loaders, (list, tuple)) else [val_loaders]
    return train, [loader.dataset for loader in loaders if isinstance(loader, DataLoader)]


class LeakageCheck(DoctorCheck):
    """Hash the train and val samples and report val samples identical to a train sample.

    Args:
        max_samples: Skip the check (with a note) above this many train + val samples.
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.

    Runs on rank 0 at the start of training, or at the first validation when the val loaders load only then.
    ``leakage_overlap`` is the number of such val samples (``None`` until checked or when skipped).
    """

    name = "leakage"

    def __init__(self, max_samples: int = 1_000_000, reporter: FindingsReporter | None = None) -> None:
        self.max_samples = max_samples
        super().__init__(reporter)

    def reset(self) -> None:
        self.leakage_overlap: int | None = None
        self.pending = False  # the val loaders were not loaded at the start of training: check at the validation

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            self.check(trainer)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.pending and not trainer.sanity_checking and trainer.is_global_zero:
            self.check(trainer)

    def check(self, trainer: pl.Trainer) -> None:
        """Hash the splits now and report the overlap (or note why the check is skipped)."""
        self.pending = False
        note = self.reporter.note
        train, vals = split_datasets(trainer)
        if train is None:
            note(trainer, "leakage check skipped: the train loader is not one DataLoader")
            return
        if vals is None:
            self.pending = True  # validation loaders load later (no sanity check): try at validation
            return
        if any(isinstance(d, IterableDataset) for d in (train, *vals)):  # a stream (even with a length) has no
            # samples to index: its splits are a hash of each row's key, disjoint by construction
            note(trainer, "leakage check skipped: iterable datasets have no samples to hash up front")
            return
        try:
            n_train = len(train)  # type: ignore[arg-type]
            n_val = sum(len(v) for v in vals)  # type: ignore[arg-type]
        except TypeError:
            note(trainer, "leakage check skipped: iterable datasets have no samples to hash up front")
            return
        if n_val == 0:
            return
        if n_train + n_val > self.max_samples:
            note(
                trainer,
                f"leakage check skipped: {n_train + n_val:,} samples > "
                f"leakage_max_samples={self.max_samples:,}",
            )
            return
        started = time.perf_counter()
        try:
            with isolate_rng():  # reading samples must not move the RNG that shuffles and augments
                train_hashes = set(sample_hashes(train))
                overlap = sum(h in train_hashes for v in vals for h in sample_hashes(v))
        except TypeError as err:
            note(trainer, f"leakage check skipped: {err}")
            return
        self.leakage_overlap = overlap
        # one number per run: a tag, not a one-point metric series (which MLflow's charts and parallel coordinates
        # put before val/* and train/*)
        self.reporter.set_tag(trainer, OVERLAP_TAG, str(overlap))
        seconds = time.perf_counter() - started
        note(
            trainer,
            f"leakage check: {overlap} of {n_val:,} val samples are identical to one of {n_train:,} train samples "
            f"({seconds:.1f} s)",
        )
        if overlap:
            self.reporter.report(
                trainer,
                self.name,
                f"{overlap} of {n_val:,} val samples ({overlap / n_val:.1%}) are identical (inputs and targets) to "
                "a train sample: the validation score overstates how well the model generalizes. Split before any "
                "preprocessing or augmentation, and de-duplicate the data before splitting.",
            )


__all__ = ["OVERLAP_TAG", "LeakageCheck", "SplitDatasets", "split_datasets"]
