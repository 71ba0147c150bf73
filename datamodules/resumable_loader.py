"""``ResumableDataLoader``: a train loader whose position in the epoch is part of a checkpoint.

Lightning 2.6 stores ``state_dict()`` of a train loader that has ``state_dict``/``load_state_dict`` in the fit
loop's checkpoint state and gives it back on resume; a plain ``DataLoader`` has none, so a run resumed mid-epoch
restarted the epoch's data at its first batch while the batch index and step count went on. This loader's state is
the epoch of its current pass and the batches it has handed to the loop; loaded, the next pass of that epoch
starts after those batches, and the rest of the epoch is what the uninterrupted run saw (loopwise's samplers draw
an epoch's order from ``seed + epoch``).

Two details make it exact:

* **What the loop consumed, not what was prefetched.** Worker processes run ahead of the loop (``prefetch_factor``
  batches each), and so does the sampler; the count is of batches this loader handed out in the main process.
  Lightning fetches a batch only when it trains it when the loader has a length (every loopwise loader).
* **A pass begins at its first batch, not at ``iter()``.** With workers, ``DataLoader.__iter__`` draws the first
  indices from the sampler at once; Lightning calls ``iter()`` before it calls ``set_epoch`` for the epoch (and on
  resume before it has restored the epoch at all), so a pass drawn then would follow the wrong epoch's order. This
  loader's ``iter()`` returns a ``LoaderPass`` that starts torch's iterator at the first ``next()``.

The position is applied where it costs nothing: a dataset that keeps its own order (``PositionedStream``: a streamed
table) is told the epoch and the batches done before its workers start; a sampler or batch sampler with ``load_state_dict`` (loopwise's)
starts there. Any other (e.g. the ``DistributedSampler`` Lightning puts in place under DDP) is fast-forwarded by
fetching and dropping the batches already trained (exact, but those batches are read again).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

from torch.utils.data import DataLoader


def pass_epoch(loader: DataLoader) -> int | None:
    """The epoch whose order ``loader``'s next pass follows: its batch sampler's ``current_epoch()``, else the
    ``epoch`` of its sampler; ``None`` when nothing keeps one."""
    current = getattr(loader.batch_sampler, "current_epoch", None)
    if callable(current):
        return int(current())
    for sampler in (getattr(loader.batch_sampler, "sampler", None), loader.sampler):
        epoch = getattr(sampler, "epoch", None)
        if isinstance(epoch, int):
            return epoch
    return None


@runtime_checkable
class PositionedStream(Protocol):
    """An ``IterableDataset`` that keeps its own order: ``epoch`` is the epoch of its next pass, and
    ``start_pass(epoch, batches)`` makes that pass the one of ``epoch``, starting after its first ``batches``
    batches (``StreamingTableDataset``)."""

    epoch: int

    def start_pass(self, epoch: int, batches: int) -> None: ...


class LoaderPass(Iterator):
    """One pass over a ``ResumableDataLoader``: torch's iterator, started at the first ``next()``, counted."""

    def __init__(self, loader: ResumableDataLoader) -> None:
        self.loader = loader
        self.iterator: Iterator[Any] | None = None

    def __next__(self) -> Any:
        if self.iterator is None:
            self.iterator = self.loader.begin_pass()
        batch = next(self.iterator)
        self.loader.count_batch()
        return batch


class ResumableDataLoader(DataLoader):
    """A ``DataLoader`` with ``state_dict``/``load_state_dict``: the epoch of its current pass and the batches it has
    handed out; loaded, the next pass of that epoch starts after them.

    Takes exactly ``DataLoader``'s arguments (Lightning rebuilds loaders from them, e.g. to add a
    ``DistributedSampler``).
    """

    _pass_epoch: int | None = None
    _batches = 0
    _resume: tuple[int | None, int] | None = None  # (epoch, batches) for the next pass of that epoch

    def __iter__(self) -> LoaderPass:  # type: ignore[override]
        return LoaderPass(self)

    def begin_pass(self) -> Iterator[Any]:
        """Start a pass (called by its first ``next()``): after the batches a loaded state says are done, when it
        is for this pass's epoch. Returns torch's iterator, positioned."""
        stream = self.dataset if isinstance(self.dataset, PositionedStream) else None
        epoch = stream.epoch if stream is not None else pass_epoch(self)
        resume, self._resume = self._resume, None
        if stream is not None and resume is not None and resume[0] is not None:
            epoch = resume[0]  # a stream's pass follows the saved epoch (a new loader's stream starts at epoch 0)
        skip = resume[1] if resume is not None and resume[0] in (None, epoch) else 0
        self._pass_epoch, self._batches = epoch, skip
        if stream is not None:  # before torch's iterator: the workers get the dataset as it is then
            stream.start_pass(epoch, skip)
        positioned = skip == 0 or stream is not None or self.position_samplers(epoch, skip)
        iterator = super().__iter__()
        if not positioned:
            for _ in range(skip):  # a sampler that cannot start part-way: read and drop the batches done
                next(iterator)
        return iterator

    def position_samplers(self, epoch: int | None, batches: int) -> bool:
        """Start the samplers' next pass after ``batches`` batches, where they can (``load_state_dict``): the batch
        sampler of a loader built with one, else the sampler (``batches * batch_size`` indices). ``False`` when
        neither can."""
        target: Any = self.sampler if self.batch_size is not None else self.batch_sampler
        items = batches * self.batch_size if self.batch_size is not None else batches
        if epoch is None or not callable(getattr(target, "load_state_dict", None)):
            return False
        target.load_state_dict({"epoch": epoch, "position": items})
        return True

    def count_batch(self) -> None:
        """One more batch of the current pass handed to the loop."""
        self._batches += 1

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches"}``: the current pass's epoch and the batches handed out in it (a loaded state not
        yet used, as it was loaded)."""
        if self._resume is not None:
            return {"epoch": self._resume[0], "batches": self._resume[1]}
        return {"epoch": self._pass_epoch, "batches": self._batches}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start the next pass of ``state["epoch"]`` after ``state["batches"]`` batches (a pass of another epoch
        starts at its first batch). Loading the same state twice is loading it once.

        Args:
            state: What ``state_dict`` returned.
        """
        epoch, batches = state.get("epoch"), state.get("batches")
        if (epoch is not None and not isinstance(epoch, int)) or not isinstance(batches, int) or batches < 0:
            raise ValueError(f"ResumableDataLoader: a state is {{'epoch': int, 'batches': int >= 0}}, got {state!r}")
        self._resume = (epoch, batches)
