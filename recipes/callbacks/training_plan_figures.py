"""The figures of a training plan (``recipes.callbacks.training_plan``), as a table and as MLflow params."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import lightning.pytorch as pl

from lightning_modules.recipe_contract import fine_tuning_of


def parameter_phases(pl_module: pl.LightningModule) -> tuple[tuple[int, int, int], ...]:
    """(first epoch, trainable, frozen) parameter counts of the module's network per phase of its fine-tuning
    schedule (``Task.fine_tuning.phases()``); for another module, one phase counted from ``requires_grad``."""
    fine_tuning = fine_tuning_of(pl_module)
    if fine_tuning is not None:
        return tuple(tuple(phase) for phase in fine_tuning.phases())  # type: ignore[misc]
    counts = [(p.numel(), p.requires_grad) for p in pl_module.parameters()]
    trainable = sum(n for n, grad in counts if grad)
    return ((0, trainable, sum(n for n, _ in counts) - trainable),)


def phase_params(phases: tuple[tuple[int, int, int], ...]) -> dict[str, Any]:
    """``plan.trainable_parameters`` and ``plan.frozen_parameters`` at the start; ``plan.phases`` when it changes."""
    if not phases:
        return {}
    out: dict[str, Any] = {"plan.trainable_parameters": phases[0][1], "plan.frozen_parameters": phases[0][2]}
    if len(phases) > 1:
        out["plan.phases"] = "; ".join(f"epoch {s}: {t} trainable, {f} frozen" for s, t, f in phases)
    return out


@dataclass(frozen=True)
class TrainingPlanFigures:
    """Every number of a run's plan; batch figures are per device (each device sees its own batches).

    ``total_optimizer_steps``, ``epochs``, ``micro_batches`` and ``examples_seen`` are ``None`` for a run without
    end (``max_epochs=-1`` and ``max_steps=-1``). ``last_batch_size`` is ``None`` when a batch sampler decides the
    batches (e.g. length buckets). ``examples_seen`` counts all devices, including the samples
    ``DistributedSampler`` repeats to pad the split to a multiple of the devices.
    """

    train_samples: int
    batch_size: int
    devices: int
    samples_per_device: int
    batches_per_epoch: int
    last_batch_size: int | None
    drop_last: bool
    dropped_per_epoch: int
    limit_train_batches: int | float
    accumulate_grad_batches: int
    optimizer_steps_per_epoch: int
    max_epochs: int
    max_steps: int
    total_optimizer_steps: int | None
    bound_by: Literal["max_epochs", "max_steps", "unbounded"]
    epochs: float | None
    effective_batch_size: int
    warmup_steps: int
    micro_batches: int | None
    examples_seen: int | None
    #: (first epoch, trainable, frozen) parameters of each phase of a fine-tuning schedule (one phase without one)
    parameter_phases: tuple[tuple[int, int, int], ...] = ()

    def as_params(self) -> dict[str, Any]:
        """The figures as flat ``plan.*`` params (values as MLflow shows them)."""

        def show(value: Any) -> Any:
            return "unbounded" if value is None else value

        return {
            "plan.train_samples": self.train_samples,
            "plan.batch_size": self.batch_size,
            "plan.devices": self.devices,
            "plan.batches_per_epoch": self.batches_per_epoch,
            "plan.last_batch_size": "variable" if self.last_batch_size is None else self.last_batch_size,
            "plan.drop_last": self.drop_last,
            "plan.dropped_per_epoch": self.dropped_per_epoch,
            "plan.accumulate_grad_batches": self.accumulate_grad_batches,
            "plan.optimizer_steps_per_epoch": self.optimizer_steps_per_epoch,
            "plan.total_optimizer_steps": show(self.total_optimizer_steps),
            "plan.bound_by": self.bound_by,
            "plan.epochs": show(None if self.epochs is None else round(self.epochs, 4)),
            "plan.effective_batch_size": self.effective_batch_size,
            "plan.warmup_steps": self.warmup_steps,
            "plan.micro_batches": show(self.micro_batches),
            "plan.examples_seen": show(self.examples_seen),
            **phase_params(self.parameter_phases),
        }

    def table(self) -> str:
        """The plan as a plain-text table (readable in non-TTY logs)."""
        rows: list[tuple[str, str]] = []
        per_device = f" ({self.samples_per_device:,} per device)" if self.devices > 1 else ""
        rows.append(("train samples", f"{self.train_samples:,}{per_device}"))
        rows.append(("batch size", f"{self.batch_size}" + (" per device" if self.devices > 1 else "")))
        rows.append(("devices", f"{self.devices}"))
        limit = ""
        if self.limit_train_batches != 1.0:
            limit = f" (limit_train_batches={self.limit_train_batches})"
        rows.append(("batches per epoch", f"{self.batches_per_epoch:,}{limit}"))
        if self.last_batch_size is None:
            last = "variable (a batch sampler decides the batches)"
        elif self.drop_last and self.dropped_per_epoch:
            where = " on each device" if self.devices > 1 else ""
            last = f"{self.last_batch_size} (drop_last=True drops {self.dropped_per_epoch} samples per epoch{where})"
        else:
            last = f"{self.last_batch_size} (drop_last={self.drop_last})"
        rows.append(("last batch size", last))
        rows.append(("gradient accumulation", f"{self.accumulate_grad_batches}"))
        rows.append(("optimizer steps / epoch", f"{self.optimizer_steps_per_epoch:,}"))
        if self.total_optimizer_steps is None:
            total = "unbounded (max_epochs=-1, max_steps=-1)"
        else:
            epochs = "?" if self.epochs is None else f"{self.epochs:g} epoch" + ("" if self.epochs == 1 else "s")
            total = f"{self.total_optimizer_steps:,} ({epochs}; {self.bound_by} binds)"
        rows.append(("optimizer steps total", total))
        parts = f"{self.batch_size} x {self.accumulate_grad_batches} x {self.devices} device(s)"
        rows.append(("effective batch size", f"{self.effective_batch_size:,} ({parts})"))
        rows.append(("warmup steps", f"{self.warmup_steps:,}"))
        rows.append(("micro-batches", "unbounded" if self.micro_batches is None else f"{self.micro_batches:,}"))
        rows.append(("examples seen", "unbounded" if self.examples_seen is None else f"{self.examples_seen:,}"))
        for start, trainable, frozen in self.parameter_phases:
            name = "parameters" if len(self.parameter_phases) == 1 else f"parameters from epoch {start}"
            rows.append((name, f"{trainable:,} trainable, {frozen:,} frozen"))
        width = max(len(name) for name, _ in rows)
        lines = ["Training plan"] + [f"  {name:<{width}}  {value}" for name, value in rows]
        return "\n".join(lines)


__all__ = ["TrainingPlanFigures", "parameter_phases", "phase_params"]
