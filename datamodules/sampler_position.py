"""Where a sampler is in its pass over an epoch, and where its next pass starts: the position a checkpoint keeps.

A loopwise sampler's order of epoch ``e`` depends only on its seed and ``e`` (shuffles are drawn from ``seed + e``),
so a position is two numbers: the epoch and how many items of that epoch's order are done. ``PassPosition`` counts
the items a pass yields and, after ``resume_at``, starts the next pass of that epoch there instead of at its first
item. ``CarriesPosition`` gives a sampler that keeps one its ``state_dict``/``load_state_dict`` (torchdata's
``StatefulDataLoader`` convention).

What a sampler yields is not what the training loop has consumed when DataLoader workers prefetch: the loader that
hands batches to the loop counts those (``datamodules.resumable_loader.ResumableDataLoader``) and positions its
sampler from that count.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class PassPosition:
    """The position of one sampler: the epoch of its current pass, the items that pass has yielded, and a start
    for the next pass of a given epoch (set by ``resume_at``, used once)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.resume: tuple[int, int] | None = None  # (epoch, items to skip) for the next pass of that epoch
        self._total = 0
        self._left: Iterator[Any] = iter(())  # the current pass's items not yet yielded

    @property
    def done(self) -> int:
        """How many items of its epoch's order the current pass has yielded (those skipped by a resume count)."""
        return self._total - operator.length_hint(self._left)

    def state_dict(self, epoch: int) -> dict[str, int]:
        """``{"epoch", "position"}``: the current pass's epoch and items yielded, or, before a pass of the set
        ``epoch`` begins, where a pending resume starts it (``0`` without one)."""
        if self.resume is not None and self.resume[0] == epoch:
            return {"epoch": epoch, "position": self.resume[1]}
        if self.epoch == epoch:
            return {"epoch": epoch, "position": self.done}
        return {"epoch": epoch, "position": 0}

    def resume_at(self, state: Mapping[str, Any], owner: str) -> int:
        """Start the next pass of ``state["epoch"]`` at item ``state["position"]``; returns the epoch."""
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{owner}: a state needs int 'epoch' and 'position', got {dict(state)!r}") from err
        if epoch < 0 or position < 0:
            raise ValueError(f"{owner}: epoch and position must be >= 0, got {dict(state)!r}")
        self.resume = (epoch, position)
        return epoch

    def run(self, items: list[T], epoch: int) -> Iterator[T]:
        """The pass of ``epoch`` over ``items`` (the whole epoch's order), from a pending resume's position when it is
        for this epoch. What it has yielded is counted without a Python step per item (``done``: the items less what
        the list's own iterator has left), so the loader's batches do not pay for the count."""
        start = self.resume[1] if self.resume is not None and self.resume[0] == epoch else 0
        self.resume = None
        self.epoch, self._total = epoch, len(items)
        self._left = iter(items[start:])
        return self._left


def lazy_pass(begin: Callable[[], Iterator[T]]) -> Iterator[T]:
    """An iterator that calls ``begin()`` at its first ``next()``, as a generator's body would run, and then yields
    what ``begin()`` returned with no Python step per item (``itertools.chain`` does the iterating in C)."""
    return itertools.chain.from_iterable(_begun(begin))


def _begun(begin: Callable[[], Iterator[T]]) -> Iterator[Iterator[T]]:
    yield begin()


class CarriesPosition:
    """A sampler's ``state_dict``/``load_state_dict`` from its ``position`` (a ``PassPosition``) and ``set_epoch``.

    Mixed into a sampler or batch sampler that sets ``self.position``, keeps ``self.epoch`` and has ``set_epoch``;
    one whose order follows another epoch (a batch sampler following its inner sampler) overrides
    ``position_epoch``.
    """

    position: PassPosition
    epoch: int

    def position_epoch(self) -> int:
        """The epoch whose order the sampler's passes follow now."""
        return self.epoch

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position"}``: the epoch of the order and the items (indices or batches) yielded so far."""
        return self.position.state_dict(self.position_epoch())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Use ``state["epoch"]`` and start its next pass after ``state["position"]`` items.

        Args:
            state: What ``state_dict`` returned.
        """
        self.set_epoch(self.position.resume_at(state, type(self).__name__))  # type: ignore[attr-defined]
