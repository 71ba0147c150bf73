"""Freezing parts of a network and unfreezing them on schedule, on Lightning's ``BaseFinetuning``.

``FreezeSchedule`` is the ``BaseFinetuning`` callback a task returns from ``configure_callbacks`` when it has
``freeze`` patterns: Lightning calls it at setup (freeze) and at every training epoch start (unfreeze what is due).
It freezes and unfreezes with ``BaseFinetuning``'s own ``freeze_module`` / ``make_trainable``. Unlike
``BaseFinetuning.unfreeze_and_add_param_group`` it adds no parameter group when unfreezing: the task put the frozen
parameters into their groups when it built the optimizer (the optimizer skips a parameter without a gradient), so
the learning-rate schedule, built once from the groups that exist then, covers them from the first step. A group
added later would keep a constant learning rate under ``LambdaLR``/``OneCycleLR``, which step only the groups they
were built with, without a word.

Frozen norm layers stay in eval mode (their running statistics are the pretrained ones, neither updated nor
replaced by batch statistics): ``Task.train`` asks ``frozen_norm_layers`` after Lightning switches modes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import BaseFinetuning
from torch import nn
from torch.optim import Optimizer

from lightning_modules.compat import BATCH_AND_INSTANCE_NORM
from lightning_modules.fine_tuning.initial_weights import matches

NORMS: tuple[type[nn.Module], ...] = (BATCH_AND_INSTANCE_NORM, nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


class FreezeSchedule(BaseFinetuning):
    """Freeze the parts of a task's network that match ``freeze`` and unfreeze each at its epoch.

    Args:
        network: The task's network (``task.model``); patterns name its modules.
        freeze: Module name patterns (``fnmatch``; a pattern without wildcards also names everything under it), e.g.
            ``["features"]``, ``["blocks.0", "blocks.1", "tok_emb"]``.
        unfreeze_at_epoch: ``None``: frozen for the whole run; an int: every frozen part trains from that epoch
            (0-based) on; a mapping pattern -> epoch (its keys among ``freeze``): gradual unfreezing, a pattern left
            out stays frozen.
    """

    def __init__(
        self, network: nn.Module, freeze: list[str], unfreeze_at_epoch: int | Mapping[str, int] | None = None
    ) -> None:
        super().__init__()
        if not freeze:
            raise ValueError("freeze: name at least one module pattern")
        if isinstance(unfreeze_at_epoch, Mapping):
            unknown = [p for p in unfreeze_at_epoch if p not in freeze]
            if unknown:
                raise ValueError(f"unfreeze_at_epoch: {unknown} are not among the freeze patterns {list(freeze)}")
            epochs: dict[str, int | None] = {p: unfreeze_at_epoch.get(p) for p in freeze}
        else:
            epochs = {p: unfreeze_at_epoch for p in freeze}
        for pattern, epoch in epochs.items():
            if epoch is not None and (not isinstance(epoch, int) or epoch < 1):
                raise ValueError(f"unfreeze_at_epoch: {pattern!r} must unfreeze at an epoch >= 1, got {epoch!r}")
        self.network = network
        self.unfreeze_epochs = epochs
        names = [name for name, _ in network.named_modules() if name]
        for pattern in freeze:
            if not any(matches(name, [pattern]) for name in names):
                children = [name for name, _ in network.named_children()]
                raise ValueError(
                    f"freeze: {pattern!r} matches no module of {type(network).__name__} (its parts: {children})"
                )
        #: patterns frozen right now
        self.frozen_patterns: set[str] = set()

    def modules_of(self, patterns: list[str]) -> list[nn.Module]:
        """The network's modules named by ``patterns`` (with everything under them), each once."""
        found = {id(m): m for name, m in self.network.named_modules() if name and matches(name, patterns)}
        return list(found.values())

    def scheduled_parameters(self) -> list[nn.Parameter]:
        """Every parameter this schedule freezes at some point (the task puts them into the optimizer's groups)."""
        params = {id(p): p for m in self.modules_of(list(self.unfreeze_epochs)) for p in m.parameters(recurse=False)}
        return list(params.values())

    def frozen_norm_layers(self) -> list[nn.Module]:
        """The norm layers frozen right now (kept in eval mode by ``Task.train``)."""
        return [m for m in self.modules_of(sorted(self.frozen_patterns)) if isinstance(m, NORMS)]

    def apply(self, epoch: int | None) -> None:
        """Freeze every part not yet due at ``epoch`` and unfreeze the rest (``None``: before training)."""
        due = [p for p, e in self.unfreeze_epochs.items() if epoch is not None and e is not None and epoch >= e]
        frozen = [p for p in self.unfreeze_epochs if p not in due]
        frozen_modules = self.modules_of(frozen)
        frozen_ids = {id(m) for m in frozen_modules}
        self.make_trainable([m for m in self.modules_of(due) if id(m) not in frozen_ids])
        for module in frozen_modules:
            self.freeze_module(module)
            if isinstance(module, NORMS):
                module.eval()
        self.frozen_patterns = set(frozen)

    def phases(self) -> list[tuple[int, int, int]]:
        """(first epoch, trainable parameters, frozen parameters) of the network for each phase of the schedule."""
        starts = sorted({0} | {e for e in self.unfreeze_epochs.values() if e is not None})
        total = {id(p): p.numel() for p in self.network.parameters()}
        out = []
        for start in starts:
            frozen = [p for p, e in self.unfreeze_epochs.items() if e is None or start < e]
            frozen_ids = {id(p) for m in self.modules_of(frozen) for p in m.parameters(recurse=False)}
            frozen_count = sum(total[i] for i in frozen_ids if i in total)
            out.append((start, sum(total.values()) - frozen_count, frozen_count))
        return out

    # --- BaseFinetuning -----------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.world_size > 1 and any(e is not None for e in self.unfreeze_epochs.values()):
            raise ValueError(
                "unfreeze_at_epoch with several processes: DDP synchronizes only the parameters that are trainable "
                "when it wraps the model, so parts unfrozen later would train apart on each process. Freeze for the "
                "whole run, or fit the phases one after the other (the second with init_from the first's checkpoint)"
            )
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: pl.LightningModule) -> None:
        self.apply(None)

    def finetune_function(self, pl_module: pl.LightningModule, epoch: int, optimizer: Optimizer) -> None:
        self.apply(epoch)
        pl_module.train(pl_module.training)  # frozen norm layers back to eval, unfrozen ones to the task's mode

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning skips on_train_epoch_start when a run resumes in the middle of an epoch (the last.ckpt of a stop
        # or a crash): without this the rest of that epoch would train with the parts due by then still frozen
        self.finetune_function(pl_module, trainer.current_epoch, trainer.optimizers[0] if trainer.optimizers else None)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # BaseFinetuning's version also records new parameter groups for a resume; no group is ever added here, and
        # on a resume ``apply`` unfreezes everything due by the resumed epoch
        self.finetune_function(pl_module, trainer.current_epoch, trainer.optimizers[0] if trainer.optimizers else None)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


__all__ = ["FreezeSchedule"]
