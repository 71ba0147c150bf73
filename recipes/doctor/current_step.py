"""The training steps as the per-step checks read them: kept on the device, read back a few steps at a time.

Reading a value back to the host (``float(loss)``, ``bool(torch.isfinite(...))``) makes the CPU wait for the GPU
to finish all queued work, so the host can no longer run ahead. ``CurrentStep`` therefore keeps, for every training
batch, only device tensors and plain Python facts: the loss (detached), which rows of the batch's floating-point
inputs hold NaN/inf (one flag per row), and the total gradient norm before clipping (the one the task's clipping
measured, or measured here once where nothing else does). Nothing is read per step.

The kept steps are read, in one host-device transfer, at these moments (``READ_HOOKS``), and handed in order to the
checks that subscribed (``StepReader``):

- before the optimizer step of a logging step (every ``log_every_n_steps``), of the epoch's last batch and of the
  run's last step: a non-finite step found then has not been applied yet;
- at the start of each validation during fit, at the end of each epoch and of training;
- before every checkpoint save: a non-finite step is always found before weights it touched are written.

``LoopDoctor`` records the steps once for all its checks; a check used on its own records its own (``StepCheck``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from torch import Tensor

from recipes.doctor.read_steps import is_read_step
from lightning_modules.batches import split_batch
from lightning_modules.recipe_contract import clipping_measures_gradient_norm, measured_gradient_norm
from recipes.doctor.base import CALLBACK_HOOKS, DoctorCheck, DoctorPart
from recipes.doctor.findings import FindingsReporter
from recipes.hooks.forwarding import ForwardingCallback, defines

# the hooks at which the kept steps are read (besides the optimizer step of a logging step, see ``CurrentStep``)
READ_HOOKS = ("on_validation_start", "on_train_epoch_end", "on_train_end", "on_save_checkpoint")
# every hook ``CurrentStep`` records or reads in
STEP_HOOKS = (
    "on_train_batch_start",
    "on_before_backward",
    "on_before_optimizer_step",
    "on_train_batch_end",
    *READ_HOOKS,
)


def total_gradient_norm(optimizer: torch.optim.Optimizer) -> Tensor | None:
    """The 2-norm of all gradients of ``optimizer``'s parameters, as a 0-d tensor on their device (nothing is read
    back to the host); ``None`` without gradients."""
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return None
    if hasattr(torch.nn.utils, "get_total_norm"):
        return torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))  # torch < 2.6


def input_tensors(inputs: Any) -> list[Tensor]:
    """The tensors of a batch's inputs (a tensor, a mapping or a sequence of them)."""
    if isinstance(inputs, Tensor):
        return [inputs]
    if isinstance(inputs, Mapping):
        return [v for v in inputs.values() if isinstance(v, Tensor)]
    if isinstance(inputs, (tuple, list)):
        return [v for v in inputs if isinstance(v, Tensor)]
    return []


def input_row_sums(inputs: Any) -> tuple[Tensor, ...]:
    """The row sums (over all but the first dimension) of each floating-point input tensor of a batch: device
    tensors, nothing read back. A NaN or inf makes its row's sum non-finite, so one summing pass per step keeps what
    ``nonfinite_rows_of_sums`` needs to name the rows later (the flags themselves are only computed for a step found
    non-finite); half-precision rows are summed in float32."""
    sums: list[Tensor] = []
    for t in input_tensors(inputs):
        if not (t.is_floating_point() and t.ndim >= 1 and t.numel()):
            continue
        wide = torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else None
        rows = t.detach() if t.requires_grad else t  # one call fewer per step where it changes nothing
        sums.append((rows if rows.ndim == 2 else rows.reshape(t.shape[0], -1)).sum(dim=1, dtype=wide))
    return tuple(sums)


def nonfinite_rows_of_sums(sums: tuple[Tensor, ...]) -> Tensor | None:
    """One flag per row from ``input_row_sums``: whether that row of a floating-point input held NaN/inf (tensors of
    another row count than the first are left out); ``None`` without any."""
    flags: Tensor | None = None
    for row_sums in sums:
        bad = ~torch.isfinite(row_sums)
        if flags is None:
            flags = bad
        elif flags.shape == bad.shape and flags.device == bad.device:
            flags = flags | bad
    return flags


def nonfinite_row_flags(inputs: Any) -> Tensor | None:
    """One flag per row (first dimension) of the batch: whether a floating-point input tensor holds NaN/inf in that
    row. A device tensor, nothing read back; ``None`` when the inputs have no floating-point tensor.

    A NaN or inf makes its row's sum non-finite, so one summing pass over the batch finds the rows (a third of the
    cost of ``isfinite`` on every element on a CPU); half-precision rows are summed in float32."""
    return nonfinite_rows_of_sums(input_row_sums(inputs))


@dataclass(eq=False)
class KeptStep:
    """One training batch as kept on the device until the next read."""

    global_step: int
    epoch: int
    batch_idx: int
    loss: Tensor | None = None
    loss_scaled: bool = False  # the fp16 GradScaler's scaled loss (seen in on_before_backward)
    row_sums: tuple[Tensor, ...] = ()  # input_row_sums of the batch (NaN/inf rows found from them when needed)
    gradient_norm: Tensor | None = None
    norm_from_module: bool = False  # the task's clipping measures it: taken from the module at the batch's end
    read: bool = False  # handed to the readers already


@dataclass(frozen=True)
class ReadStep:
    """One training batch as read back to the host.

    ``applied``: the optimizer step of this batch has already run (the step was read after it); ``bad_rows``: the
    rows of the batch's inputs holding NaN/inf (read only for the non-finite step); ``loss_scaled``: ``loss`` is the
    fp16 GradScaler's scaled loss."""

    global_step: int
    epoch: int
    batch_idx: int
    loss: float | None
    gradient_norm: float | None
    applied: bool
    loss_scaled: bool = False
    bad_rows: list[int] = field(default_factory=list)


class StepReader:
    """What a check that reads training steps implements; ``read_order`` orders the readers of one read (lower
    first): the gradient-norm series, then the initial loss, then the non-finite guard, which may stop the run."""

    read_order: ClassVar[int] = 0

    def read_steps(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, steps: list[ReadStep], bad: ReadStep | None
    ) -> None:
        """``steps``: the batches read now, in order, up to (not including) ``bad``, the first batch whose loss or
        gradient norm is NaN/inf (``None`` when there is none)."""

    def before_checkpoint_save(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called after the read that precedes every checkpoint save; raise to refuse the save."""


class CurrentStep(DoctorPart):
    """Keeps the training steps on the device and hands them to its readers a few steps at a time.

    Args:
        record_batch: Keep each batch's loss (detached) and the rows of its inputs that hold NaN/inf.
        measure_gradients: Keep the total gradient norm before clipping of every optimizer step: the one the task's
            clipping by norm measures (``Task.gradient_norm``), or measured here where nothing else measures it.
    """

    def __init__(self, record_batch: bool = True, measure_gradients: bool = True) -> None:
        self.record_batch = record_batch
        self.measure_gradients = measure_gradients
        self.readers: list[StepReader] = []
        super().__init__()

    def reset(self) -> None:
        self.kept: list[KeptStep] = []
        self.current: KeptStep | None = None
        self.reads = 0  # host reads so far (for tests and benchmarks)

    def subscribe(self, reader: StepReader) -> None:
        """Hand every read to ``reader`` too (readers are called in ``read_order``)."""
        if reader not in self.readers:
            self.readers.append(reader)
            self.readers.sort(key=lambda r: r.read_order)

    def hooks(self) -> tuple[str, ...]:
        if not (self.record_batch or self.measure_gradients):
            return ()
        return tuple(name for name in STEP_HOOKS if self.record_batch or name != "on_before_backward")

    # --- recording (no host reads) --------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = KeptStep(trainer.global_step, trainer.current_epoch, batch_idx)
        if self.record_batch:
            try:
                inputs, _ = split_batch(batch)
            except ValueError:
                inputs = None
            step.row_sums = input_row_sums(inputs)
        self.current = step
        self.kept.append(step)

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        if self.current is not None:
            self.current.loss = loss.detach()
            self.current.loss_scaled = getattr(trainer.precision_plugin, "scaler", None) is not None

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        step = self.current
        read_now = is_read_step(trainer)  # read before this update: a non-finite step is stopped before it
        if step is not None and self.measure_gradients:
            if not read_now and clipping_measures_gradient_norm(pl_module):
                step.norm_from_module = True
            else:
                step.gradient_norm = total_gradient_norm(optimizer)
        if read_now:
            self.read(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step, self.current = self.current, None
        if step is None or step.read:
            return
        if step.norm_from_module:
            step.gradient_norm = measured_gradient_norm(pl_module)
            step.norm_from_module = False
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if self.record_batch and isinstance(loss, Tensor):
            step.loss, step.loss_scaled = loss.detach(), False  # the step's loss before any GradScaler scaling

    # --- reading ------------------------------------------------------------------------------------------------
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self.read(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.read(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.read(trainer, pl_module)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.read(trainer, pl_module)
        for reader in self.readers:
            reader.before_checkpoint_save(trainer, pl_module)

    def read(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Read the kept steps back to the host (one transfer) and hand them to the readers."""
        kept, self.kept = self.kept, []
        if not kept:
            return
        self.reads += 1
        for step in kept:
            step.read = True
        values = read_values(kept)
        scaler = getattr(trainer.precision_plugin, "scaler", None) is not None
        steps: list[ReadStep] = []
        bad: ReadStep | None = None
        for step, (loss, norm) in zip(kept, values):
            applied = step.global_step < trainer.global_step
            read = ReadStep(step.global_step, step.epoch, step.batch_idx, loss, norm, applied, step.loss_scaled)
            loss_bad = loss is not None and not math.isfinite(loss)
            norm_bad = norm is not None and not math.isfinite(norm) and not scaler  # fp16: the GradScaler skips the step
            if loss_bad or norm_bad:
                flags = nonfinite_rows_of_sums(step.row_sums)
                rows = torch.nonzero(flags).flatten().tolist() if flags is not None else []
                bad = ReadStep(read.global_step, read.epoch, read.batch_idx, loss, norm, applied, step.loss_scaled,
                               rows)
                break
            steps.append(read)
        for reader in self.readers:
            reader.read_steps(trainer, pl_module, steps, bad)


def read_values(kept: list[KeptStep]) -> list[tuple[float | None, float | None]]:
    """(mean loss, gradient norm) of each kept step, read back to the host in one transfer."""
    losses = [step.loss for step in kept]
    norms = [step.gradient_norm for step in kept]
    present = [t for t in losses + norms if t is not None]
    if present and all(t.ndim == 0 and t.dtype == present[0].dtype and t.device == present[0].device for t in present):
        # the usual case, 0-d values of one dtype: one stack and one conversion instead of two operations per value
        values = iter(torch.stack([t.detach() for t in present]).double().tolist())
        read = [None if t is None else next(values) for t in losses + norms]
        return list(zip(read[: len(kept)], read[len(kept) :]))
    tensors: list[Tensor] = []
    slots: list[tuple[int | None, int | None]] = []
    for step in kept:
        loss_slot = norm_slot = None
        if step.loss is not None:
            loss_slot = len(tensors)
            tensors.append(step.loss.detach().double().mean())
        if step.gradient_norm is not None:
            norm_slot = len(tensors)
            tensors.append(step.gradient_norm.detach().double().reshape(()))
        slots.append((loss_slot, norm_slot))
    if not tensors:
        return [(None, None)] * len(kept)
    device = tensors[0].device
    flat = torch.stack([t.to(device) for t in tensors]).tolist()
    return [
        (None if a is None else flat[a], None if b is None else flat[b]) for a, b in slots
    ]


class StepCheck(DoctorCheck, ForwardingCallback, StepReader):
    """A check that reads the kept training steps: from the shared ``CurrentStep`` inside ``LoopDoctor``, or from
    one of its own when used alone (then this check forwards the recording and reading hooks, ``STEP_HOOKS``, to it
    as the callback group forwards: ``ForwardingCallback``; ``needs_batch``/``needs_gradients`` say what it keeps).
    A subclass implements ``read_steps``; one that overrides a hook of ``STEP_HOOKS`` calls ``super()``'s."""

    needs_batch = False
    needs_gradients = False

    def __init__(self, reporter: FindingsReporter | None = None, step: CurrentStep | None = None) -> None:
        self.records_step = step is None
        self.step = step if step is not None else CurrentStep(self.needs_batch, self.needs_gradients)
        self.step.subscribe(self)
        DoctorCheck.__init__(self, reporter)
        ForwardingCallback.__init__(self, [(self.step, STEP_HOOKS)] if self.records_step else [])

    def reset(self) -> None:
        if self.records_step:
            self.step.reset()

    def hooks(self) -> tuple[str, ...]:
        own = [name for name in CALLBACK_HOOKS if defines(self, name, StepCheck)]  # a subclass's own hooks
        if self.records_step:
            names = tuple(name for name in CALLBACK_HOOKS if name in STEP_HOOKS or name in own)
            return tuple(dict.fromkeys(names + self.step.hooks()))
        # shared step: only the hooks a subclass defines itself, not the forwarding ones
        return tuple(own)


__all__ = [
    "READ_HOOKS",
    "STEP_HOOKS",
    "CurrentStep",
    "KeptStep",
    "ReadStep",
    "StepCheck",
    "StepReader",
    "input_row_sums",
    "input_tensors",
    "nonfinite_row_flags",
    "nonfinite_rows_of_sums",
    "read_values",
    "total_gradient_norm",
]
