"""The ``unused_parameters`` check: trainable parameters that the loss never reaches.

A layer built but not called in ``forward``, a branch behind ``torch.no_grad()`` or ``.detach()``, a head the loss
does not use: the optimizer never changes those parameters, and nothing says so. At the first optimizer step of a
fit, every parameter with ``requires_grad`` and no gradient is one of them. Frozen parameters (``requires_grad``
off, e.g. by the task's ``freeze``) are not trained on purpose and are not reported. Reads nothing from the device:
whether ``.grad`` is ``None`` is known on the host.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from recipes.doctor.base import DoctorCheck
from recipes.doctor.findings import FindingsReporter

SHOWN = 5


class UnusedParametersCheck(DoctorCheck):
    """Warn, at the first optimizer step of a fit, about trainable parameters that got no gradient.

    Args:
        reporter: Where findings go (``LoopDoctor`` shares one); a new one when the check is used alone.
    """

    name = "unused_parameters"

    def __init__(self, reporter: FindingsReporter | None = None) -> None:
        super().__init__(reporter)

    def reset(self) -> None:
        self.checked = False
        #: names of the trainable parameters without a gradient at the first optimizer step
        self.unused: list[str] = []

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any) -> None:
        if self.checked:
            return
        self.checked = True
        unused = [(name, p.numel()) for name, p in pl_module.named_parameters() if p.requires_grad and p.grad is None]
        self.unused = [name for name, _ in unused]
        if not unused:
            return
        shown = ", ".join(self.unused[:SHOWN]) + (f" (+{len(unused) - SHOWN} more)" if len(unused) > SHOWN else "")
        count = sum(n for _, n in unused)
        self.reporter.report(
            trainer,
            self.name,
            f"{len(unused)} trainable tensor(s) ({count:,} parameters) got no gradient at the first optimizer step: "
            f"{shown}. The loss does not reach them (a layer forward never calls, a detach() or no_grad(), an unused "
            "head), so they never change: use them, remove them, or freeze them (the task's freeze: [...]); frozen "
            "parameters are not reported",
        )


__all__ = ["UnusedParametersCheck"]
