"""``CallbackGroup``: several callbacks that the Trainer sees as one, their checkpoint state under their own keys.

Lightning calls every hook on every callback of the trainer, whether the callback defines it or not, each call
inside a profiler context with the callback's ``state_key``: about a microsecond apiece, six hooks per training step
times the number of callbacks. On a small network that is a tenth of the step. Gathered in one group, the recipe's
callbacks cost one such call per hook, and the group calls only the members that define it, in their order (the
forwarding is ``recipes.hooks.forwarding``'s). A member that forwards hooks itself (the loop doctor, a nested group)
is flattened: the group calls the calls it would make, and its table is read again after ``setup`` (where the loop
doctor builds the parts of a fit).

Checkpoint state: Lightning saves ``checkpoint["callbacks"][callback.state_key] = callback.state_dict()`` for each
callback whose state is not empty, then calls every ``on_save_checkpoint``; on resume it calls every
``on_load_checkpoint``, then ``load_state_dict`` with a deep copy of the state under the callback's ``state_key``.
The group does the same for its members inside its own ``on_save_checkpoint`` / ``on_load_checkpoint`` (states
first, then the members' hooks; on load, the members' hooks, then their states), under the members' own keys, so a
checkpoint holds exactly the entries the members would have written on their own, and a checkpoint written with
the members standing alone resumes into a group and the other way round. (Lightning warns, on resume, about entries
whose key no callback of the trainer has: a member's; the recipe's CLI filters that warning, see
``recipes.run.lightning_noise``.)

Callbacks that Lightning finds by type (checkpoints, early stopping, prediction writers, progress bars, model
summaries) do not look inside a group: they stay out of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from recipes.hooks.forwarding import HOOKS, ForwardingCallback, defined_hooks, defines

# the hooks the group forwards: every ``on_*`` hook of Lightning's Callback, ``setup`` and ``teardown``
FORWARDED = HOOKS


def _stateful(callback: Callback) -> bool:
    return defines(callback, "state_dict") or defines(callback, "load_state_dict")


class CallbackGroup(ForwardingCallback):
    """Callbacks called as one: each hook goes to the members that define it, in the members' order; a member's
    checkpoint state (``state_dict``) is saved and restored under the member's own ``state_key``, as Lightning does
    for a callback of its own.

    Args:
        members: The callbacks, in the order their hooks run. Members with checkpoint state need distinct
            ``state_key``s (as Lightning requires of the trainer's callbacks).

    Raises:
        ValueError: Two stateful members share a ``state_key``.
    """

    def __init__(self, members: Sequence[Callback]) -> None:
        self.members = list(members)
        self.stateful = [m for m in self.members if _stateful(m)]
        keys = [m.state_key for m in self.stateful]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ValueError(f"CallbackGroup: more than one member keeps checkpoint state under {', '.join(twice)}")
        self._state_key = f"CallbackGroup[{','.join(type(m).__name__ for m in self.members)}]"
        super().__init__()
        self._build()

    def _build(self) -> None:
        """The table of calls: each member's own hooks; for a forwarding member, the hooks it overrides itself and,
        for the others, the calls it forwards (its ``hook_calls``)."""
        calls: dict[str, list[Any]] = {name: [] for name in HOOKS}
        for member in self.members:
            forwarding = isinstance(member, ForwardingCallback)
            own = defined_hooks(member, ForwardingCallback if forwarding else Callback)
            for name in HOOKS:
                if name in own:
                    calls[name].append(getattr(member, name))
                elif forwarding:
                    calls[name].extend(member.hook_calls[name])
        self.hook_calls = {name: tuple(found) for name, found in calls.items()}
        self.skip_empty_batch_hooks()

    @property
    def state_key(self) -> str:
        return self._state_key  # Lightning reads it at every hook call

    def member(self, kind: type) -> Any:
        """The first member that is a ``kind``, or ``None``."""
        return next((m for m in self.members if isinstance(m, kind)), None)

    # --- the group's own hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        others = {c.state_key for c in trainer.callbacks if c is not self and _stateful(c)}
        clash = sorted(others & {m.state_key for m in self.stateful})
        if clash:
            raise RuntimeError(
                f"CallbackGroup: the trainer has another callback with checkpoint state under {', '.join(clash)}; "
                "each state_key must be unique among the trainer's callbacks and the group's members"
            )
        for call in self.hook_calls["setup"]:
            call(trainer, pl_module, stage=stage)
        self._build()  # a forwarding member (the loop doctor) builds its table for this stage in its setup

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.setdefault("callbacks", {})
        ours = {member.state_key: state for member in self.stateful if (state := member.state_dict())}
        if ours:  # placed where the group stands among the trainer's callbacks: the order of the members alone
            others = dict(states)
            states.clear()
            for callback in trainer.callbacks:
                if callback is self:
                    states.update(ours)
                elif callback.state_key in others:
                    states[callback.state_key] = others.pop(callback.state_key)
            states.update(others)
            states.update(ours)  # a group inside another group: after the others
        for call in self.hook_calls["on_save_checkpoint"]:
            call(trainer, pl_module, checkpoint)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        for call in self.hook_calls["on_load_checkpoint"]:
            call(trainer, pl_module, checkpoint)
        states = checkpoint.get("callbacks") or {}
        for member in self.stateful:
            state = states.get(member.state_key)
            if state:
                member.load_state_dict(deepcopy(state))


__all__ = ["FORWARDED", "CallbackGroup", "defines"]
