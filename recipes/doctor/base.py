"""The base classes of the loop doctor's parts: each is a Lightning ``Callback`` with only the hooks it needs.

A part works on its own in ``Trainer(callbacks=[...])``; ``LoopDoctor`` owns several and forwards each Lightning
hook to the parts whose ``hooks()`` name it (``recipes.hooks.forwarding``, the callback group's mechanism), so a hook
that no enabled part needs calls no part.
"""

from __future__ import annotations

from typing import ClassVar

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from recipes.doctor.findings import Finding, FindingsReporter
from recipes.hooks.forwarding import HOOKS, defines

# the Lightning hooks a part may override ("setup" is each part's own start-of-fit reset, see DoctorPart.setup)
CALLBACK_HOOKS: tuple[str, ...] = tuple(name for name in HOOKS if name != "setup")


class DoctorPart(Callback):
    """A piece of the loop doctor: per-fit state, reset at the start of every fit, and the hooks it defines."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget the state of a previous fit (called by ``__init__`` and at the start of every fit)."""

    def hooks(self) -> tuple[str, ...]:
        """The Lightning hooks this part needs called (those its class overrides); ``LoopDoctor`` forwards these."""
        return tuple(name for name in CALLBACK_HOOKS if defines(self, name))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.reset()


class DoctorCheck(DoctorPart):
    """One check of the loop doctor. Its findings go to ``reporter``: with none given, a reporter of its own, reset
    at the start of every fit together with the check; one given (``LoopDoctor`` gives a fresh one per fit to all its
    checks) is reset by whoever gave it."""

    #: the check's name: ``Finding.check``, the tag ``doctor.<name>``, and its place in ``findings.CHECKS``
    name: ClassVar[str] = ""

    def __init__(self, reporter: FindingsReporter | None = None) -> None:
        self.owns_reporter = reporter is None
        self.reporter = reporter if reporter is not None else FindingsReporter()
        super().__init__()

    @property
    def findings(self) -> list[Finding]:
        """The findings reported in this fit (of every check that shares the reporter)."""
        return self.reporter.findings

    def already_reported(self) -> bool:
        """Whether this check has a finding in this fit."""
        return self.reporter.reported(self.name)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.owns_reporter:
            self.reporter.reset()
        super().setup(trainer, pl_module, stage)


__all__ = ["CALLBACK_HOOKS", "DoctorCheck", "DoctorPart"]
