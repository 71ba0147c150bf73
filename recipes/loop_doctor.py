"""The loop doctor: the seeds' silent training-loop bugs made loud.

``LoopDoctor`` is one callback with one switch per check:

- ``initial_loss``: the first batch's cross-entropy vs ln(C) of a freshly initialized classifier (001's debugging
  table: "for CrossEntropyLoss with C classes, loss ≈ log(C) at initialization").
- ``non_finite``: a NaN/inf loss or gradient stops the run before the optimizer step, naming the global step, the
  batch and the first parameter with a non-finite gradient (001's ``check_nan``); the run's checkpoints keep the
  last good weights and an MLflow run ends FAILED with the reason in the tag ``doctor.failure``.
- ``grad_norm``: the total gradient norm before clipping, logged every N steps as ``doctor/grad_norm``; a warning
  when it stays at >= 5x ``gradient_clip_val`` (001: "your learning rate is likely too high").
- ``data_wait``: the fraction of step time spent waiting for the next batch, logged per epoch as
  ``doctor/data_wait_fraction``, with a hint when it passes 30%.
- ``leakage``: train and val samples hashed; val samples identical to a train sample are counted
  (``doctor/val_train_overlap``) and reported.
- ``schedule_check``: a per-step LR schedule stepped per epoch (002: the LR moves ``len(loader)`` times too
  slowly) is an error before training starts; so is a ``ReduceLROnPlateau`` whose monitor is never logged (checked
  at the end of the first epoch with a validation, before Lightning steps the scheduler).
- ``mode_check``: validation must run with every module in eval mode and training must resume with the modules
  that trained before back in train mode (002: "the model trains in eval mode without error").

Every finding is kept in ``LoopDoctor.findings``, warned (``LoopDoctorWarning``) and, with an MLflow logger, set
as the run tag ``doctor.<check>``.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from lightning.pytorch.utilities.seed import isolate_rng
from torch import Tensor
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR
from torch.utils.data import DataLoader, Dataset
from torchmetrics import Metric, MetricCollection

from lightning_modules.compat import time_train_fetches, untime_train_fetches
from lightning_modules.language_model import LanguageModelModule
from lightning_modules.task import Task, split_batch
from recipes.tracking import find_mlflow_logger

TAG_LIMIT = 500
CHECKS = ("initial_loss", "non_finite", "grad_norm", "data_wait", "leakage", "schedule", "mode")
# attributes of torch schedulers that hold their length; equal to the run's optimizer steps means "sized in steps"
LENGTH_ATTRIBUTES = ("T_max", "total_iters", "total_steps", "T_0")


class LoopDoctorWarning(UserWarning):
    """A finding of the loop doctor."""


class NonFiniteError(RuntimeError):
    """A NaN or inf loss or gradient: the run is stopped before the optimizer step applies it."""


class ScheduleError(ValueError):
    """The LR schedule is configured so that it cannot do what it was built for."""


@dataclass(frozen=True)
class Finding:
    """One problem the loop doctor found: which check, what it says, and when (optimizer step, epoch)."""

    check: str
    message: str
    step: int
    epoch: int


# --- sample hashing (leakage) --------------------------------------------------------------------------------
def _feed(h: Any, obj: Any) -> None:
    """Feed one sample (tensors, arrays, numbers, strings, nested sequences and mappings) into a hash."""
    if isinstance(obj, Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, np.ndarray):
        a = np.ascontiguousarray(obj)
        h.update(f"A{a.dtype}{a.shape}".encode())
        h.update(a.tobytes())
    elif isinstance(obj, (str, bytes, int, float, bool, np.generic)) or obj is None:
        h.update(f"S{type(obj).__name__}:{obj!r}".encode())
    elif isinstance(obj, Mapping):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(f"{key!r}:".encode())
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (tuple, list)):
        h.update(b"(")
        for item in obj:
            _feed(h, item)
        h.update(b")")
    elif hasattr(obj, "tobytes") and hasattr(obj, "mode") and hasattr(obj, "size"):  # PIL image
        h.update(f"I{obj.mode}{obj.size}".encode())
        h.update(obj.tobytes())
    else:
        raise TypeError(f"cannot hash samples of type {type(obj).__name__}")


def _digest(sample: Any) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    _feed(h, sample)
    return h.digest()


def sample_hashes(dataset: Dataset) -> Iterator[bytes]:
    """One hash per sample of a map-style dataset: its inputs and targets (identical samples, identical hashes).

    Tensor datasets (``.tensors``: ``TensorDataset``, ``BatchedTensorDataset``) are hashed row by row without
    ``__getitem__``; datasets with ``raw(i)`` and ``labels`` (``ImageFolderDataset``) hash the decoded image before
    augmentation; any other dataset is read with ``dataset[i]``.
    """
    n = len(dataset)  # type: ignore[arg-type]
    tensors = getattr(dataset, "tensors", None)
    if (
        isinstance(tensors, (tuple, list))
        and tensors
        and all(isinstance(t, Tensor) and t.shape[0] == n for t in tensors)
    ):
        headers = [f"T{t.dtype}{tuple(t.shape[1:])}".encode() for t in tensors]
        rows = [t.detach().cpu().contiguous().reshape(n, -1).view(torch.uint8).numpy() for t in tensors]
        for i in range(n):
            h = hashlib.blake2b(digest_size=16)
            h.update(b"(")
            for header, row in zip(headers, rows):
                h.update(header)
                h.update(row[i].tobytes())
            h.update(b")")
            yield h.digest()
        return
    raw, labels = getattr(dataset, "raw", None), getattr(dataset, "labels", None)
    if callable(raw) and labels is not None:
        for i in range(n):
            yield _digest((raw(i), labels[i]))
        return
    for i in range(n):
        yield _digest(dataset[i])


# --- module modes ------------------------------------------------------------------------------------------
def mode_modules(pl_module: pl.LightningModule) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every module of ``pl_module`` whose mode matters ("" is the LightningModule itself).

    torchmetrics metrics and everything inside them are left out: their mode changes nothing.
    """
    out: list[tuple[str, torch.nn.Module]] = []
    metric_prefixes: list[str] = []
    for name, module in pl_module.named_modules():
        if any(name.startswith(prefix) for prefix in metric_prefixes):
            continue
        if isinstance(module, (Metric, MetricCollection)):
            metric_prefixes.append(f"{name}.")
            continue
        out.append((name, module))
    return out


def modules_in_train_mode(
    pl_module: pl.LightningModule, modules: list[tuple[str, torch.nn.Module]] | None = None
) -> set[str]:
    """Names of the modules of ``pl_module`` in train mode ("" is the LightningModule itself).

    torchmetrics metrics are left out: their mode changes nothing. ``modules`` is a list from ``mode_modules``
    made earlier (the walk over the module tree is most of the cost; reading the modes is cheap).
    """
    if modules is None:
        modules = mode_modules(pl_module)
    return {name for name, module in modules if module.training}


def _show_names(names: set[str], pl_module: pl.LightningModule, limit: int = 6) -> str:
    shown = sorted(names, key=lambda n: (n.count("."), n))
    labels = [n or type(pl_module).__name__ for n in shown[:limit]]
    more = f" (+{len(shown) - limit} more)" if len(shown) > limit else ""
    return ", ".join(labels) + more


def is_multiclass_module(pl_module: pl.LightningModule) -> bool:
    """Whether the module is a softmax classifier over ``num_classes`` classes (``task="multiclass"``)."""
    return getattr(pl_module, "task", None) == "multiclass" and isinstance(getattr(pl_module, "num_classes", None), int)


def _first_nonfinite_rows(inputs: Any) -> list[int]:
    """Rows (first dimension) of the floating-point input tensors that hold a NaN or inf."""
    tensors: list[Tensor] = []
    if isinstance(inputs, Tensor):
        tensors = [inputs]
    elif isinstance(inputs, Mapping):
        tensors = [v for v in inputs.values() if isinstance(v, Tensor)]
    elif isinstance(inputs, (tuple, list)):
        tensors = [v for v in inputs if isinstance(v, Tensor)]
    rows: set[int] = set()
    for t in tensors:
        if t.is_floating_point() and t.ndim >= 1 and t.numel():
            bad = ~torch.isfinite(t.detach().reshape(t.shape[0], -1)).all(dim=1)
            rows.update(torch.nonzero(bad).flatten().tolist())
    return sorted(rows)


class LoopDoctor(Callback):
    """Checks that make the silent training-loop bugs of the seed articles loud; each one can be switched off.

    Findings are warned once per check (``LoopDoctorWarning``), kept in ``findings`` (``Finding(check, message,
    step, epoch)``) and, with an MLflow logger, set as run tags ``doctor.<check>``; the tag ``doctor.findings``
    lists the checks that found something ("none" for a clean run). Series are logged to the trainer's loggers:
    ``doctor/grad_norm``, ``doctor/data_wait_fraction``, ``doctor/val_train_overlap``. The non-finite guard and
    the schedule check stop the run (``NonFiniteError``, ``ScheduleError``) after setting the tag
    ``doctor.failure``.

    Args:
        initial_loss: Compare the first batch's loss of a multiclass classifier (or language model) with ln(C).
        initial_loss_rel_tol: Warn when |loss - ln C| exceeds this fraction of ln C ...
        initial_loss_abs_tol: ... or this many nats, whichever is larger.
        non_finite: Stop the run at the first NaN or inf loss or gradient, before the optimizer applies it.
        grad_norm: Log the total gradient norm before clipping and warn when it stays far above the clip value.
        grad_norm_every_n_steps: Log ``doctor/grad_norm`` every this many optimizer steps.
        grad_norm_window: Optimizer steps over which the median gradient norm is compared with the clip value.
        grad_norm_clip_factor: Warn when that median is at least this many times ``gradient_clip_val``.
        data_wait: Measure the fraction of step time spent waiting for the next batch.
        data_wait_threshold: Hint when the typical (median) step waits more than this fraction of its time.
        data_wait_skip_batches: Batches at the start of each epoch left out (worker start-up).
        leakage: Hash the train and val samples and report val samples identical to a train sample.
        leakage_max_samples: Skip the leakage check (with a note) above this many train + val samples.
        schedule_check: Fail before training on a per-step LR schedule stepped per epoch, and after the first
            validation on a plateau schedule whose monitored metric is never logged.
        mode_check: Check that validation runs in eval mode and training resumes in train mode.
    """

    def __init__(
        self,
        initial_loss: bool = True,
        initial_loss_rel_tol: float = 0.5,
        initial_loss_abs_tol: float = 0.75,
        non_finite: bool = True,
        grad_norm: bool = True,
        grad_norm_every_n_steps: int = 25,
        grad_norm_window: int = 10,
        grad_norm_clip_factor: float = 5.0,
        data_wait: bool = True,
        data_wait_threshold: float = 0.3,
        data_wait_skip_batches: int = 3,
        leakage: bool = True,
        leakage_max_samples: int = 1_000_000,
        schedule_check: bool = True,
        mode_check: bool = True,
    ) -> None:
        if grad_norm_every_n_steps < 1:
            raise ValueError(f"LoopDoctor: grad_norm_every_n_steps must be >= 1, got {grad_norm_every_n_steps}")
        if grad_norm_window < 1:
            raise ValueError(f"LoopDoctor: grad_norm_window must be >= 1, got {grad_norm_window}")
        if grad_norm_clip_factor <= 0:
            raise ValueError(f"LoopDoctor: grad_norm_clip_factor must be > 0, got {grad_norm_clip_factor}")
        if not 0.0 < data_wait_threshold < 1.0:
            raise ValueError(f"LoopDoctor: data_wait_threshold must be in (0, 1), got {data_wait_threshold}")
        if data_wait_skip_batches < 0:
            raise ValueError(f"LoopDoctor: data_wait_skip_batches must be >= 0, got {data_wait_skip_batches}")
        if initial_loss_rel_tol < 0 or initial_loss_abs_tol < 0:
            raise ValueError("LoopDoctor: initial_loss_rel_tol and initial_loss_abs_tol must be >= 0")
        self.initial_loss = initial_loss
        self.initial_loss_rel_tol = initial_loss_rel_tol
        self.initial_loss_abs_tol = initial_loss_abs_tol
        self.non_finite = non_finite
        self.grad_norm = grad_norm
        self.grad_norm_every_n_steps = grad_norm_every_n_steps
        self.grad_norm_window = grad_norm_window
        self.grad_norm_clip_factor = grad_norm_clip_factor
        self.data_wait = data_wait
        self.data_wait_threshold = data_wait_threshold
        self.data_wait_skip_batches = data_wait_skip_batches
        self.leakage = leakage
        self.leakage_max_samples = leakage_max_samples
        self.schedule_check = schedule_check
        self.mode_check = mode_check
        self._reset()

    def _reset(self) -> None:
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        # initial loss
        self.initial_loss_value: float | None = None
        self._initial_loss_pending = True
        # non-finite and grad norm
        self._loss: Tensor | None = None
        self._batch: Any = None
        self._batch_idx = -1
        self.grad_norms: list[tuple[int, float]] = []  # (global step, norm) of the logged steps
        self._norm_window: deque[float] = deque(maxlen=self.grad_norm_window)
        # data wait
        self.data_wait_fractions: list[tuple[int, float]] = []  # (epoch, median fraction)
        self._step_fractions: list[float] = []
        self._last_batch_end: float | None = None
        self._batch_start: float | None = None
        self._pending_wait: float | None = None
        self._batches_in_epoch = 0
        self._fetch_seconds: float | None = None  # under DDP: time inside the train loader's fetches (see below)
        self._fetch_started: float | None = None
        # leakage
        self.leakage_overlap: int | None = None
        self._leakage_pending = False
        # schedule
        self._plateau_monitors: list[tuple[str, str]] = []
        self._validated_this_epoch = False
        # mode
        self._mode_modules: list[tuple[str, torch.nn.Module]] | None = None  # walked once per fit, read per batch
        self._train_modes: set[str] | None = None  # modules in train mode just before the latest validation
        self._resume_check_pending = False

    # --- reporting ------------------------------------------------------------------------------------------
    def reported(self, check: str) -> bool:
        """Whether ``check`` has a finding in this fit."""
        return any(f.check == check for f in self.findings)

    def _report(self, trainer: pl.Trainer, check: str, message: str, warn: bool = True) -> None:
        self.findings.append(Finding(check, message, trainer.global_step, trainer.current_epoch))
        if warn:
            rank_zero_warn(f"LoopDoctor [{check}]: {message}", category=LoopDoctorWarning)
        self._set_tag(trainer, f"doctor.{check}", message)

    def _set_tag(self, trainer: pl.Trainer, key: str, value: str) -> None:
        logger = find_mlflow_logger(trainer.loggers)
        if logger is not None and trainer.is_global_zero:
            logger.experiment.set_tag(logger.run_id, key, value[:TAG_LIMIT])

    def _log_metric(self, trainer: pl.Trainer, name: str, value: float) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({name: value}, step=trainer.global_step)

    def _info(self, trainer: pl.Trainer, line: str) -> None:
        self.notes.append(line)
        if trainer.is_global_zero:
            print(f"LoopDoctor: {line}", flush=True)

    # --- fit start: schedules, baseline modes, leakage ------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._reset()

    def _modes(self, pl_module: pl.LightningModule) -> set[str]:
        if self._mode_modules is None:
            self._mode_modules = mode_modules(pl_module)
        return modules_in_train_mode(pl_module, self._mode_modules)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mode_modules = mode_modules(pl_module)
        if self.schedule_check:
            self._check_schedules(trainer, pl_module)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_train_mode(trainer, pl_module)  # after the sanity check's validation
        if self.leakage and trainer.is_global_zero:
            self._check_leakage(trainer)
        if self.data_wait and trainer.world_size > 1:
            self._time_fetches(trainer)

    def _time_fetches(self, trainer: pl.Trainer) -> None:
        """Under DDP, time the train loader's fetches themselves instead of the whole gap between batches.

        Before every batch Lightning's DDP loop broadcasts a stop flag from rank 0 (``_broadcast_sigterm_tensor``),
        which waits for the slowest rank; in the gap between batches that wait would read as data wait. The epoch
        loop brackets each fetch with its profiler hooks (``_on_before_fetch``/``_on_after_fetch``); timing those
        measures the loader alone. Without those hooks (another Lightning version) the gap is measured as on one
        device.
        """
        def started() -> None:
            self._fetch_started = time.perf_counter()

        def finished() -> None:
            if self._fetch_started is not None and self._fetch_seconds is not None:
                self._fetch_seconds += time.perf_counter() - self._fetch_started
            self._fetch_started = None

        if time_train_fetches(trainer, started, finished):
            self._fetch_seconds = 0.0

    def _untime_fetches(self, trainer: pl.Trainer) -> None:
        untime_train_fetches(trainer)
        self._fetch_seconds = None

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._untime_fetches(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        checks = sorted({f.check for f in self.findings}, key=CHECKS.index)
        self._set_tag(trainer, "doctor.findings", ",".join(checks) or "none")
        summary = "no findings" if not checks else f"{len(self.findings)} finding(s): {', '.join(checks)}"
        if trainer.is_global_zero:
            print(f"LoopDoctor: {summary}", flush=True)

    # --- schedule sanity ------------------------------------------------------------------------------------
    def _fail(self, trainer: pl.Trainer, check: str, error: type[Exception], message: str) -> None:
        self._report(trainer, check, message, warn=False)
        self._set_tag(trainer, "doctor.failure", message)
        raise error(message)

    def _check_schedules(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        schedule = getattr(pl_module, "schedule", None)
        configs = trainer.lr_scheduler_configs
        for config in configs:
            scheduler = config.scheduler
            name = type(scheduler).__name__
            if config.reduce_on_plateau:
                monitor = str(config.monitor)
                if not is_overridden("validation_step", pl_module):
                    no_validation = "the module has no validation_step"
                elif trainer.limit_val_batches == 0:
                    no_validation = "limit_val_batches=0"
                else:
                    no_validation = ""
                if no_validation and not monitor.startswith("train"):
                    self._fail(
                        trainer,
                        "schedule",
                        ScheduleError,
                        f"{name} monitors {monitor!r} but validation never runs ({no_validation}): the LR would "
                        "never change. Enable validation or use a schedule that does not need a metric.",
                    )
                self._plateau_monitors.append((name, monitor))
                continue
            if config.interval != "epoch":
                continue
            # the task's schedule object describes the scheduler only when the task's configure_optimizers built it
            built_by_schedule = type(pl_module).configure_optimizers is Task.configure_optimizers
            reason = self._per_step_reason(trainer, scheduler, schedule if built_by_schedule else None)
            if reason:
                trainer.estimated_stepping_batches  # loads the train loader if the module has not asked yet
                batches = trainer.num_training_batches
                slower = "many times"
                if math.isfinite(batches) and batches > 0:
                    slower = f"{math.ceil(batches / trainer.accumulate_grad_batches)}x"
                self._fail(
                    trainer,
                    "schedule",
                    ScheduleError,
                    f"{reason}, but it is stepped once per epoch (lr_scheduler interval='epoch', Lightning's "
                    f"default): the LR would move {slower} too slowly and never finish its schedule. Return "
                    "{'scheduler': ..., 'interval': 'step'} as the lr_scheduler config.",
                )

    @staticmethod
    def _per_step_reason(trainer: pl.Trainer, scheduler: Any, schedule: Any) -> str | None:
        name = type(scheduler).__name__
        if isinstance(scheduler, (OneCycleLR, CyclicLR)):
            return f"{name} is a per-step schedule"
        if schedule is not None and getattr(schedule, "interval", None) == "step":
            return f"the task's schedule {type(schedule).__name__} is a per-step schedule ({name})"
        for attribute in LENGTH_ATTRIBUTES:
            length = getattr(scheduler, attribute, None)
            if not isinstance(length, int) or length <= 1:
                continue
            total = trainer.estimated_stepping_batches
            max_epochs = trainer.max_epochs if trainer.max_epochs and trainer.max_epochs > 0 else None
            if math.isfinite(total) and length == int(total) and (max_epochs is None or length > max_epochs):
                return f"{name} is sized in optimizer steps ({attribute}={length}, the run's optimizer steps)"
        return None

    def _check_plateau_monitors(self, trainer: pl.Trainer) -> None:
        for name, monitor in self._plateau_monitors:
            if monitor not in trainer.callback_metrics:
                available = ", ".join(sorted(trainer.callback_metrics)) or "none"
                self._fail(
                    trainer,
                    "schedule",
                    ScheduleError,
                    f"{name} monitors {monitor!r}, which is never logged (after a validation the logged metrics "
                    f"are: {available}): the LR would never change. Set the schedule's monitor to one of them.",
                )
        self._plateau_monitors = []  # checked once: a metric logged once stays in callback_metrics

    # --- leakage --------------------------------------------------------------------------------------------
    @staticmethod
    def _split_datasets(trainer: pl.Trainer) -> tuple[Dataset | None, list[Dataset] | None]:
        datasets = getattr(trainer.datamodule, "datasets", None)
        if isinstance(datasets, Mapping) and datasets.get("train") is not None and datasets.get("val") is not None:
            return datasets["train"], [datasets["val"]]
        train_loader = trainer.train_dataloader
        train = train_loader.dataset if isinstance(train_loader, DataLoader) else None
        val_loaders = trainer.val_dataloaders
        if val_loaders is None:
            return train, None
        if isinstance(val_loaders, Mapping):
            loaders = list(val_loaders.values())
        else:
            loaders = list(val_loaders) if isinstance(val_loaders, (list, tuple)) else [val_loaders]
        return train, [loader.dataset for loader in loaders if isinstance(loader, DataLoader)]

    def _check_leakage(self, trainer: pl.Trainer) -> None:
        self._leakage_pending = False
        train, vals = self._split_datasets(trainer)
        if train is None:
            self._info(trainer, "leakage check skipped: the train loader is not one DataLoader")
            return
        if vals is None:
            self._leakage_pending = True  # validation loaders load later (no sanity check): try at validation
            return
        try:
            n_train = len(train)  # type: ignore[arg-type]
            n_val = sum(len(v) for v in vals)  # type: ignore[arg-type]
        except TypeError:
            self._info(trainer, "leakage check skipped: iterable datasets have no samples to hash up front")
            return
        if n_val == 0:
            return
        if n_train + n_val > self.leakage_max_samples:
            self._info(
                trainer,
                f"leakage check skipped: {n_train + n_val:,} samples > "
                f"leakage_max_samples={self.leakage_max_samples:,}",
            )
            return
        started = time.perf_counter()
        try:
            with isolate_rng():  # reading samples must not move the RNG that shuffles and augments
                train_hashes = set(sample_hashes(train))
                overlap = sum(h in train_hashes for v in vals for h in sample_hashes(v))
        except TypeError as err:
            self._info(trainer, f"leakage check skipped: {err}")
            return
        self.leakage_overlap = overlap
        self._log_metric(trainer, "doctor/val_train_overlap", overlap)
        seconds = time.perf_counter() - started
        self._info(
            trainer,
            f"leakage check: {overlap} of {n_val:,} val samples are identical to one of {n_train:,} train samples "
            f"({seconds:.1f} s)",
        )
        if overlap:
            self._report(
                trainer,
                "leakage",
                f"{overlap} of {n_val:,} val samples ({overlap / n_val:.1%}) are identical (inputs and targets) to "
                "a train sample: the validation score overstates how well the model generalizes. Split before any "
                "preprocessing or augmentation, and de-duplicate the data before splitting.",
            )

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._leakage_pending and not trainer.sanity_checking and trainer.is_global_zero:
            self._check_leakage(trainer)

    # --- mode check -----------------------------------------------------------------------------------------
    def _check_eval_mode(self, trainer: pl.Trainer, pl_module: pl.LightningModule, where: str) -> None:
        if not self.mode_check or self.reported("mode"):
            return
        training = self._modes(pl_module)
        if training:
            self._report(
                trainer,
                "mode",
                f"validation ran with {len(training)} module(s) in train mode ({where}): "
                f"{_show_names(training, pl_module)}. Something (a forward, validation_step or hook calling "
                ".train()) switches modes during validation: dropout stays active and batch norm uses and updates "
                "batch statistics, so validation metrics are noisy and the running statistics absorb val data.",
            )

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._check_eval_mode(trainer, pl_module, "at the start of a validation batch")

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._check_eval_mode(trainer, pl_module, f"after validation_step of batch {batch_idx}")

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._pending_wait = None
        self._last_batch_end = None  # the validation's time is no data wait

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.mode_check:
            self._train_modes = self._modes(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._validated_this_epoch = True
        if trainer.state.fn == "fit" and self._train_modes is not None:
            self._resume_check_pending = True  # Lightning restores the modes after this hook: check at the next one

    def _check_train_mode(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a validation: the modules that trained just before it must be in train mode again.

        Compared with the modes right before the validation, not with fixed ones, so modules the user freezes (at
        any time, e.g. batch norm in ``on_train_epoch_start``) are never flagged.
        """
        if not self._resume_check_pending or self._train_modes is None:
            return
        self._resume_check_pending = False
        if not self.mode_check or self.reported("mode"):
            return
        missing = self._train_modes - self._modes(pl_module)
        if missing:
            self._report(
                trainer,
                "mode",
                f"training resumed after validation with {len(missing)} module(s) still in eval mode: "
                f"{_show_names(missing, pl_module)}. Something (an on_validation_model_train override or a hook "
                "calling .eval()) does not restore train mode: dropout is off and batch norm is frozen, so the model "
                "trains in eval mode without error.",
            )

    # --- per batch: timing, loss, gradients -----------------------------------------------------------------
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._step_fractions = []
        self._last_batch_end = None
        self._pending_wait = None
        self._batches_in_epoch = 0
        self._validated_this_epoch = False

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        self._pending_wait = None
        if self._last_batch_end is not None and self._batches_in_epoch >= self.data_wait_skip_batches:
            # one device: the whole gap since the last batch; DDP: the fetches in it (``_time_fetches``)
            self._pending_wait = now - self._last_batch_end if self._fetch_seconds is None else self._fetch_seconds
        self._batch = batch
        self._batch_idx = batch_idx
        self._loss = None
        self._check_train_mode(trainer, pl_module)
        self._batch_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.perf_counter()
        if self.data_wait and self._pending_wait is not None and self._batch_start is not None:
            wait, compute = self._pending_wait, now - self._batch_start
            if wait + compute > 0:
                self._step_fractions.append(wait / (wait + compute))
        self._pending_wait = None
        self._batch = None
        self._batches_in_epoch += 1
        if self.mode_check:
            self._train_modes = self._modes(pl_module)  # a validation may follow this batch
        if self._fetch_seconds is not None:
            self._fetch_seconds = 0.0
        self._last_batch_end = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_train_mode(trainer, pl_module)  # after the epoch-end validation
        if self.data_wait and self._step_fractions:
            fraction = statistics.median(self._step_fractions)
            self.data_wait_fractions.append((trainer.current_epoch, fraction))
            self._log_metric(trainer, "doctor/data_wait_fraction", fraction)
            if fraction > self.data_wait_threshold and not self.reported("data_wait"):
                loader = trainer.train_dataloader
                workers = getattr(loader, "num_workers", "?")
                pinned = getattr(loader, "pin_memory", "?")
                self._report(
                    trainer,
                    "data_wait",
                    f"the training loop waits for the next batch {fraction:.0%} of a typical step in epoch "
                    f"{trainer.current_epoch} (threshold {self.data_wait_threshold:.0%}): the data loader is the "
                    f"bottleneck (num_workers={workers}, pin_memory={pinned}). Use more DataLoader workers "
                    "(num_workers, with persistent_workers), pinned memory when training on a GPU, or the in-memory "
                    "path (tensors fetched a whole batch at a time, BatchedTensorDataset) for data that fits in RAM.",
                )
        self._step_fractions = []
        if self.schedule_check and self._validated_this_epoch and self._plateau_monitors:
            self._check_plateau_monitors(trainer)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        self._loss = loss.detach()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loss = self._loss
        if loss is None:
            return
        if self.non_finite and not bool(torch.isfinite(loss).all()):
            self._fail_non_finite(trainer, pl_module, f"loss ({float(loss.float().mean())})")
        if self.initial_loss and self._initial_loss_pending:
            self._initial_loss_pending = False
            if trainer.global_step == 0 and self._batch_idx == 0:  # a fresh start, not a resumed run
                self._check_initial_loss(trainer, pl_module, loss)

    def _check_initial_loss(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        if isinstance(pl_module, LanguageModelModule):
            classes, what = int(pl_module.vocab_size), "vocabulary size"
        elif is_multiclass_module(pl_module):
            classes, what = int(pl_module.num_classes), "classes"
        else:
            return  # binary/multilabel BCE, regression, unknown losses: no reference value
        if classes < 2:
            return
        value = float(loss.float().mean()) * trainer.accumulate_grad_batches  # Lightning divides by accumulation
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is not None:
            value /= float(scaler.get_scale())  # on_before_backward sees the fp16 GradScaler's scaled loss
        self.initial_loss_value = value
        expected = math.log(classes)
        margin = max(self.initial_loss_rel_tol * expected, self.initial_loss_abs_tol)
        if abs(value - expected) <= margin:
            return
        if value > expected:
            why = (
                "the freshly initialized model is confidently wrong: check the output layer's initialization scale "
                "(large initial logits), that the labels are the class indices the outputs stand for, and the "
                "output shape"
            )
        else:
            why = (
                "the task looks solved before training: check that the labels do not leak into the inputs and that "
                "the loss is the mean cross-entropy over the classes"
            )
        self._report(
            trainer,
            "initial_loss",
            f"first-batch loss {value:.3f} vs ln({classes}) = {expected:.3f} expected at initialization for "
            f"{classes} {what} (tolerance {margin:.2f}): {why}.",
        )

    def _first_nonfinite_grad(self, pl_module: pl.LightningModule) -> str | None:
        for name, param in pl_module.named_parameters():
            if param.grad is not None and not bool(torch.isfinite(param.grad).all()):
                return name
        return None

    def _fail_non_finite(self, trainer: pl.Trainer, pl_module: pl.LightningModule, what: str) -> None:
        param = self._first_nonfinite_grad(pl_module)
        where = f"global step {trainer.global_step} (epoch {trainer.current_epoch}, batch {self._batch_idx})"
        first = param if param is not None else "none (all gradients are finite)"
        message = f"non-finite {what} at {where}; first parameter with a non-finite gradient: {first}"
        rows: list[int] = []
        if self._batch is not None:
            try:
                inputs, _ = split_batch(self._batch)
                rows = _first_nonfinite_rows(inputs)
            except ValueError:
                rows = []
        if rows:
            shown = ", ".join(str(r) for r in rows[:5]) + (" ..." if len(rows) > 5 else "")
            message += f". The batch's inputs hold NaN/inf in row(s) {shown} of the batch: check the data"
        else:
            lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
            message += f". The inputs are finite: the learning rate (lr={lr}) is the likely cause, lower it"
            if len(self._norm_window) >= 2:
                message += (
                    f" (the gradient norm before clipping went from {self._norm_window[0]:.3g} to "
                    f"{self._norm_window[-1]:.3g} over the last {len(self._norm_window)} optimizer steps)"
                )
            if not trainer.gradient_clip_val:
                message += "; add gradient clipping (gradient_clip_val=1.0)"
            message += "; otherwise look for log(0) or a division by zero in the loss, and prefer bf16 to fp16"
        message += ". Stopped before the optimizer step applied it: the weights and checkpoints stay finite."
        self._fail(trainer, "non_finite", NonFiniteError, message)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not (self.grad_norm or self.non_finite):
            return
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not grads:
            return
        if hasattr(torch.nn.utils, "get_total_norm"):
            total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        else:  # pragma: no cover - torch < 2.6
            total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
        norm = float(total)
        if not math.isfinite(norm):
            if getattr(trainer.precision_plugin, "scaler", None) is not None:
                return  # fp16 GradScaler: it skips this step and lowers its scale
            if self.non_finite:
                self._fail_non_finite(trainer, pl_module, f"gradient (total norm {norm})")
            return
        if not self.grad_norm:
            return
        step = trainer.global_step
        self._norm_window.append(norm)
        if step % self.grad_norm_every_n_steps == 0:
            self.grad_norms.append((step, norm))
            self._log_metric(trainer, "doctor/grad_norm", norm)
        self._check_grad_norm(trainer)

    def _check_grad_norm(self, trainer: pl.Trainer) -> None:
        clip = trainer.gradient_clip_val
        algorithm = str(trainer.gradient_clip_algorithm or "norm").lower()
        if not clip or "value" in algorithm or self.reported("grad_norm"):
            return
        if len(self._norm_window) < self.grad_norm_window:
            return
        median = statistics.median(self._norm_window)
        if median < self.grad_norm_clip_factor * float(clip):
            return
        lr = trainer.optimizers[0].param_groups[0].get("lr") if trainer.optimizers else None
        self._report(
            trainer,
            "grad_norm",
            f"the gradient norm before clipping has a median of {median:.3g} over the last {len(self._norm_window)} "
            f"optimizer steps, >= {self.grad_norm_clip_factor:g}x gradient_clip_val={clip}: clipping rescales "
            f"nearly every step. The learning rate (lr={lr}) is the likely cause, not the gradients: lower it "
            "rather than clipping harder.",
        )


__all__ = ["CHECKS", "Finding", "LoopDoctor", "LoopDoctorWarning", "NonFiniteError", "ScheduleError", "sample_hashes"]
