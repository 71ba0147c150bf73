"""The ``data_wait`` check: the fraction of step time spent waiting for the next batch.

The median over an epoch's steps is logged as ``doctor/data_wait_fraction``; a hint when it passes the threshold
(30% by default): the data loader is the bottleneck. Tensors already in memory (a plain ``BatchedTensorDataset`` or
``TensorDataset``) get no hint: no loader setting shortens their wait (``holds_tensors``).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import lightning.pytorch as pl

from recipes.compat.internals import time_train_fetches, untime_train_fetches
from recipes.doctor.base import DoctorCheck
from recipes.doctor.findings import FindingsReporter


class DataWaitCheck(DoctorCheck):
    """Measure the fraction of step time spent waiting for the next batch and hint when the loader is the bottleneck.

    Args:
        threshold: Hint when the typical (median) step waits more than this fraction of its time.
        skip_batches: Batches at the start of each epoch left out (worker start-up).
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.

    A step's wait is the time from the end of one training batch to the start of the next (under DDP: the train
    loader's fetches in it); its compute is the time from the start of the batch to its end. The batch hooks come in
    halves (``wait_ended``/``step_started``, ``step_ended``/``wait_started``) so that ``LoopDoctor`` can run its
    other checks' batch hooks between them: their time counts neither as wait nor as compute.
    ``data_wait_fractions`` holds (epoch, median fraction) per epoch.
    """

    name = "data_wait"

    def __init__(
        self, threshold: float = 0.3, skip_batches: int = 3, reporter: FindingsReporter | None = None
    ) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"DataWaitCheck: threshold must be in (0, 1), got {threshold}")
        if skip_batches < 0:
            raise ValueError(f"DataWaitCheck: skip_batches must be >= 0, got {skip_batches}")
        self.threshold = threshold
        self.skip_batches = skip_batches
        super().__init__(reporter)

    def reset(self) -> None:
        self.data_wait_fractions: list[tuple[int, float]] = []  # (epoch, median fraction)
        self._step_fractions: list[float] = []
        self._last_batch_end: float | None = None
        self._batch_start: float | None = None
        self._pending_wait: float | None = None
        self._batches_in_epoch = 0
        self._fetch_seconds: float | None = None  # under DDP: time inside the train loader's fetches
        self._fetch_started: float | None = None

    # --- the batch hooks, in halves ---------------------------------------------------------------------------
    def wait_ended(self) -> None:
        """A training batch starts: the wait for it ends now."""
        now = time.perf_counter()
        self._pending_wait = None
        if self._last_batch_end is not None and self._batches_in_epoch >= self.skip_batches:
            # one device: the whole gap since the last batch; DDP: the fetches in it (``_time_fetches``)
            self._pending_wait = now - self._last_batch_end if self._fetch_seconds is None else self._fetch_seconds

    def step_started(self) -> None:
        """The batch's compute starts now."""
        self._batch_start = time.perf_counter()

    def step_ended(self) -> None:
        """A training batch ends now: its wait and compute become one fraction."""
        now = time.perf_counter()
        if self._pending_wait is not None and self._batch_start is not None:
            wait, compute = self._pending_wait, now - self._batch_start
            if wait + compute > 0:
                self._step_fractions.append(wait / (wait + compute))
        self._pending_wait = None
        self._batches_in_epoch += 1

    def wait_started(self) -> None:
        """The wait for the next batch starts now."""
        if self._fetch_seconds is not None:
            self._fetch_seconds = 0.0
        self._last_batch_end = time.perf_counter()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.wait_ended()
        self.step_started()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.step_ended()
        self.wait_started()

    # --- epochs, validation, DDP ------------------------------------------------------------------------------
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.world_size > 1:
            self._time_fetches(trainer)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step_fractions = []
        self._last_batch_end = None
        self._pending_wait = None
        self._batches_in_epoch = 0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pending_wait = None
        self._last_batch_end = None  # the validation's time is no data wait

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._step_fractions:
            fraction = statistics.median(self._step_fractions)
            self.data_wait_fractions.append((trainer.current_epoch, fraction))
            self.reporter.log_metric(trainer, "doctor/data_wait_fraction", fraction)
            loader = trainer.train_dataloader
            if fraction > self.threshold and not self.already_reported() and not holds_tensors(loader):
                workers = getattr(loader, "num_workers", "?")
                pinned = getattr(loader, "pin_memory", "?")
                self.reporter.report(
                    trainer,
                    self.name,
                    f"the training loop waits for the next batch {fraction:.0%} of a typical step in epoch "
                    f"{trainer.current_epoch} (threshold {self.threshold:.0%}): the data loader is the "
                    f"bottleneck (num_workers={workers}, pin_memory={pinned}). Use more DataLoader workers "
                    "(num_workers, with persistent_workers), pinned memory when training on a GPU, or the in-memory "
                    "path (tensors fetched a whole batch at a time, BatchedTensorDataset) for data that fits in RAM.",
                )
        self._step_fractions = []

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            untime_train_fetches(trainer)
            self._fetch_seconds = None

    def _time_fetches(self, trainer: pl.Trainer) -> None:
        """Under DDP, time the train loader's fetches themselves instead of the whole gap between batches.

        Before every batch Lightning's DDP loop broadcasts a stop flag from rank 0, which waits for the slowest
        rank; in the gap between batches that wait would read as data wait. The epoch loop brackets each fetch with
        its profiler hooks; timing those (``compat.time_train_fetches``) measures the loader alone. Without those
        hooks (another Lightning version) the gap is measured as on one device.
        """

        def started() -> None:
            self._fetch_started = time.perf_counter()

        def finished() -> None:
            if self._fetch_started is not None and self._fetch_seconds is not None:
                self._fetch_seconds += time.perf_counter() - self._fetch_started
            self._fetch_started = None

        if time_train_fetches(trainer, started, finished):
            self._fetch_seconds = 0.0


def holds_tensors(loader: Any) -> bool:
    """Whether ``loader`` reads tensors already in memory (a plain ``BatchedTensorDataset`` or ``TensorDataset``,
    not a subclass that computes its samples): no loader setting shortens its wait, which is the training loop's own
    work between steps (hooks, logging), so the check logs the fraction and gives no loader advice."""
    from torch.utils.data import TensorDataset  # noqa: PLC0415

    from datamodules.tensor_dataset import BatchedTensorDataset  # noqa: PLC0415

    return type(getattr(loader, "dataset", None)) in (BatchedTensorDataset, TensorDataset)


__all__ = ["DataWaitCheck", "holds_tensors"]
