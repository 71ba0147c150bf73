"""The ``mode`` check: validation runs in eval mode, and training resumes in train mode afterwards.

002: "the model trains in eval mode without error". Every module of the LightningModule whose mode matters (all but
torchmetrics metrics) must be in eval mode during validation; after it, the modules that trained just before it must
be in train mode again. Comparing with the modes right before each validation, not with fixed ones, leaves modules
the user freezes on purpose (at any time) alone.

What a training batch costs: Lightning captures every module's mode when a validation starts and puts exactly those
modes back when it ends, unless the LightningModule overrides ``on_validation_model_train`` (then the override
alone decides; ``ModelHooks.on_validation_model_train``'s documentation). Only such a module can resume training
with modules left in eval mode, so only for it does the check read the modes after every training batch (the
snapshot a validation that follows is compared with); for any other module a training batch reads nothing.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torchmetrics import Metric, MetricCollection

from recipes.doctor.base import DoctorCheck
from recipes.doctor.findings import FindingsReporter


def mode_modules(pl_module: pl.LightningModule) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every module of ``pl_module`` whose mode matters ("" is the LightningModule itself).

    torchmetrics metrics and everything inside them are left out: their mode changes nothing; so is the task's loss
    module (``pl_module.loss``) when it has no submodules and no parameters (``nn.CrossEntropyLoss``, the tasks' own).
    """
    out: list[tuple[str, torch.nn.Module]] = []
    metric_prefixes: list[str] = []
    loss = getattr(pl_module, "loss", None)
    for name, module in pl_module.named_modules():
        if any(name.startswith(prefix) for prefix in metric_prefixes):
            continue
        if module is loss and not any(True for _ in module.children()) and not any(True for _ in module.parameters()):
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


def restores_modes_itself(pl_module: pl.LightningModule) -> bool:
    """Whether Lightning puts back, after each validation, the modes every module had when it started: it does
    unless the LightningModule overrides ``on_validation_model_train`` (then the override decides)."""
    return type(pl_module).on_validation_model_train is pl.LightningModule.on_validation_model_train


def show_names(names: set[str], pl_module: pl.LightningModule, limit: int = 6) -> str:
    """The first ``limit`` module names, shallowest first ("" shown as the LightningModule's class name)."""
    shown = sorted(names, key=lambda n: (n.count("."), n))
    labels = [n or type(pl_module).__name__ for n in shown[:limit]]
    more = f" (+{len(shown) - limit} more)" if len(shown) > limit else ""
    return ", ".join(labels) + more


class TrainEvalModeCheck(DoctorCheck):
    """Check that validation runs in eval mode and training resumes in train mode.

    Args:
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.

    The module tree is walked once per fit. Each training batch reads the modes (the snapshot a validation that
    follows the batch is compared with) only when the LightningModule overrides ``on_validation_model_train``:
    otherwise Lightning itself restores the modes of right before the validation, and a batch reads nothing.
    """

    name = "mode"

    def __init__(self, reporter: FindingsReporter | None = None) -> None:
        super().__init__(reporter)

    def reset(self) -> None:
        self._mode_modules: list[tuple[str, torch.nn.Module]] | None = None  # walked once per fit, read per batch
        self._train_modes: set[str] | None = None  # modules in train mode just before the latest validation
        self._resume_check_pending = False
        self._snapshots = True  # read the modes after each training batch (set at fit start)

    def _modes(self, pl_module: pl.LightningModule) -> set[str]:
        if self._mode_modules is None:
            self._mode_modules = mode_modules(pl_module)
        return modules_in_train_mode(pl_module, self._mode_modules)

    # --- validation in eval mode ------------------------------------------------------------------------------
    def _check_eval_mode(self, trainer: pl.Trainer, pl_module: pl.LightningModule, where: str) -> None:
        if self.already_reported():
            return
        if self._mode_modules is not None and not any(module.training for _, module in self._mode_modules):
            return  # the usual case, without building the set of names
        training = self._modes(pl_module)
        if training:
            self.reporter.report(
                trainer,
                self.name,
                f"validation ran with {len(training)} module(s) in train mode ({where}): "
                f"{show_names(training, pl_module)}. Something (a forward, validation_step or hook calling "
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

    # --- training resumes in train mode -----------------------------------------------------------------------
    def _check_train_mode(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a validation: the modules that trained just before it must be in train mode again.

        Compared with the modes right before the validation, not with fixed ones, so modules the user freezes (at
        any time, e.g. batch norm in ``on_train_epoch_start``) are never flagged.
        """
        if not self._resume_check_pending or self._train_modes is None:
            return
        self._resume_check_pending = False
        if self.already_reported():
            return
        missing = self._train_modes - self._modes(pl_module)
        if missing:
            self.reporter.report(
                trainer,
                self.name,
                f"training resumed after validation with {len(missing)} module(s) still in eval mode: "
                f"{show_names(missing, pl_module)}. Something (an on_validation_model_train override or a hook "
                "calling .eval()) does not restore train mode: dropout is off and batch norm is frozen, so the model "
                "trains in eval mode without error.",
            )

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._mode_modules = mode_modules(pl_module)
        # without an override, Lightning restores the modes it captured when each validation started
        self._snapshots = not restores_modes_itself(pl_module)

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._snapshots:
            self._train_modes = self._modes(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == "fit" and self._train_modes is not None:
            self._resume_check_pending = True  # Lightning restores the modes after this hook: check at the next one

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_train_mode(trainer, pl_module)  # after the sanity check's validation

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._resume_check_pending:
            self._check_train_mode(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._snapshots:
            self._train_modes = self._modes(pl_module)  # a validation may follow this batch

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._check_train_mode(trainer, pl_module)  # after the epoch-end validation


__all__ = ["TrainEvalModeCheck", "mode_modules", "modules_in_train_mode", "restores_modes_itself", "show_names"]
