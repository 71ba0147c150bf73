"""``ForwardingCallback``: one Lightning callback that calls other objects' hooks, only where they define them.

Lightning calls every hook on every callback of the trainer, whether the callback defines it or not, each call
inside a profiler context with the callback's ``state_key``: about a microsecond apiece, six hooks per training step
times the number of callbacks. A ``ForwardingCallback`` is one such callback in front of several members: it keeps,
per hook, the members' bound methods to call (``hook_calls``), built once by ``forward_to`` from the hooks each
member names, so a hook that no member needs calls nothing further and a member's empty base-class hooks are never
called. The callback group (``recipes.callbacks.callback_group.CallbackGroup``: the members' own overrides), the loop
doctor (``recipes.doctor.loop_doctor.LoopDoctor``: the hooks each part asks for) and a doctor check used alone
(``recipes.doctor.current_step.StepCheck``: its own step record's hooks) all forward this way; a group flattens a
forwarding member (the recipe's loop doctor is the last member of its group): it calls the member's ``hook_calls``
itself, so the doctor's parts are called by the same single table as the other callbacks.

A subclass may override a hook to work around the forwarded calls; it then runs ``self.hook_calls[name]`` itself.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from lightning.pytorch.callbacks import Callback

from recipes.compat.internals import BATCH_HOOKS, skip_batch_hooks

# the hooks a ForwardingCallback forwards: every ``on_*`` hook of Lightning's Callback, ``setup`` and ``teardown``
HOOKS: tuple[str, ...] = tuple(
    name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")
)


def defines(callback: Callback, hook: str, base: type = Callback) -> bool:
    """Whether ``callback``'s class overrides ``hook`` of ``base`` (Lightning's base class defines every hook as a
    no-op; a subclass of a forwarding base passes that base to ask for the hooks it defines itself)."""
    return getattr(type(callback), hook, None) is not getattr(base, hook, None)


def defined_hooks(callback: Callback, base: type = Callback) -> tuple[str, ...]:
    """The hooks of ``HOOKS`` that ``callback``'s class overrides (see ``defines``), in Lightning's order."""
    return tuple(name for name in HOOKS if defines(callback, name, base))


class ForwardingCallback(Callback):
    """A callback that forwards each of Lightning's hooks to the calls ``hook_calls`` lists for it, in order.

    Args:
        members: (member, the names of the hooks to forward to it) pairs, in the order their hooks run; more can be
            set later with ``forward_to``.
    """

    def __init__(self, members: Iterable[tuple[object, Iterable[str]]] = ()) -> None:
        self.forward_to(members)

    def forward_to(self, members: Iterable[tuple[object, Iterable[str]]]) -> None:
        """Forward each hook to the members that name it, in the members' order (replacing the previous table).

        Raises:
            TypeError: A member names a hook that is not one of ``HOOKS``.
        """
        calls: dict[str, list[Callable[..., Any]]] = {name: [] for name in HOOKS}
        for member, hooks in members:
            for name in hooks:
                if name not in calls:
                    raise TypeError(f"{type(self).__name__} does not forward {name} (needed by {type(member).__name__})")
                calls[name].append(getattr(member, name))
        #: per hook: the members' bound methods it calls, in order
        self.hook_calls: dict[str, tuple[Callable[..., Any], ...]] = {
            name: tuple(hooks) for name, hooks in calls.items()
        }
        self.skip_empty_batch_hooks()

    def skip_empty_batch_hooks(self) -> None:
        """Make Lightning skip the batch hooks that forward to nothing (and that a subclass does not override): they
        would cost a profiled call apiece at every batch. Called again whenever ``hook_calls`` is rebuilt."""
        own = defined_hooks(self, ForwardingCallback)
        skip_batch_hooks(self, [name for name in BATCH_HOOKS if self.hook_calls[name] or name in own])


def _forwarder(name: str) -> Callable[..., None]:
    """The method that forwards hook ``name``: it passes what Lightning gives (``setup``/``teardown`` get ``stage=`` by
    keyword; the batch hooks of validation, test and predict get ``dataloader_idx`` only with several loaders) to
    each member that forwards it."""

    def forward(self: ForwardingCallback, *args: Any, **kwargs: Any) -> None:
        for call in self.hook_calls[name]:
            call(*args, **kwargs)

    forward.__name__, forward.__qualname__ = name, f"ForwardingCallback.{name}"
    forward.__doc__ = f"Call ``{name}`` on the members that forward it."
    return forward


for _name in HOOKS:
    setattr(ForwardingCallback, _name, _forwarder(_name))


__all__ = ["HOOKS", "ForwardingCallback", "defined_hooks", "defines"]
