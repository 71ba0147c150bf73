"""``CallbackGroup``: several callbacks that the Trainer sees as one.

Lightning calls every hook on every callback of the trainer, whether the callback defines it or not, each call
inside a profiler context with the callback's ``state_key``: about a microsecond apiece, six hooks per training step
times the number of callbacks. On a small network that is a tenth of the step. Most of a recipe's callbacks act at
the start or end of a fit, an epoch or a validation; gathered in one group they cost one such call per hook, and the
group calls only the members that define it, in their order (the forwarding is ``recipes.hooks.forwarding``'s, which
the loop doctor uses too).

Callbacks that Lightning must find on their own (checkpoints, early stopping, progress bars, model summaries), that
keep state in checkpoints, or whose place among the others matters, stay out of the group.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning.pytorch.callbacks import Callback

from recipes.hooks.forwarding import HOOKS, ForwardingCallback, defined_hooks, defines

# the hooks the group forwards: every ``on_*`` hook of Lightning's Callback, ``setup`` and ``teardown``
FORWARDED = HOOKS


class CallbackGroup(ForwardingCallback):
    """Callbacks called as one: each hook goes to the members that define it, in the members' order.

    Args:
        members: The callbacks, in the order their hooks run. They must keep no checkpoint state (``state_dict``):
            Lightning stores a callback's state under its own ``state_key``, which a member inside a group has not.
    """

    def __init__(self, members: Sequence[Callback]) -> None:
        stateful = [type(m).__name__ for m in members if defines(m, "state_dict") or defines(m, "load_state_dict")]
        if stateful:
            raise ValueError(f"CallbackGroup: {', '.join(stateful)} keep checkpoint state: give them to the Trainer")
        self.members = list(members)
        self._state_key = f"CallbackGroup[{','.join(type(m).__name__ for m in self.members)}]"
        super().__init__((member, defined_hooks(member)) for member in self.members)

    @property
    def state_key(self) -> str:
        return self._state_key  # Lightning reads it at every hook call

    def member(self, kind: type) -> Any:
        """The first member that is a ``kind``, or ``None``."""
        return next((m for m in self.members if isinstance(m, kind)), None)


__all__ = ["FORWARDED", "CallbackGroup", "defines"]
