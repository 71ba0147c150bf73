"""The order a streamed table is read in: which split a row belongs to, and which rows each process and loader
worker reads, in which order, in each epoch: plain arithmetic on row numbers and row-group sizes (no data).

**Splits.** A row's split comes from a stable 64-bit hash of its key (a column, e.g. a user id, so that every row of
one user lands in the same split) or of its row number in the source, mixed with the split's ``seed``: a uniform
number ``u`` in [0, 1); ``u < val_fraction`` is validation, ``u < val_fraction + test_fraction`` test, the rest
train. The hash is pandas' ``hash_array`` (SipHash with a fixed key, the same on every machine and version), so the
split never needs the whole table and a row keeps its split when rows are added to or removed from the source.

**An epoch of the train split.** The row groups are permuted (seeded by ``seed`` and the epoch); the train rows in
that order form the epoch's sequence. Each of ``world_size`` processes takes an equal contiguous share of it
(``train_rows // world_size`` rows; the last ``train_rows % world_size`` rows of the sequence are left out), and
runs ``steps = share // batch_size`` steps; the last ``share % batch_size`` rows of its share are left out too. So
every process runs the same number of steps (DDP never waits on one that ran out), and an epoch leaves out fewer
than ``world_size`` rows plus fewer than ``batch_size`` rows per process: the remainder, drawn anew each epoch.

A process's batch ``k`` comes from its loader worker ``k % workers`` (torch's ``DataLoader`` takes batches from its
workers in turn), and each worker reads one contiguous part of its process's share: the rows of its own batches.
A worker shuffles its part a window at a time: it reads ``window`` rows (a multiple of the batch size), permutes
them (seeded by ``seed``, the epoch, the process and the worker) and hands them out in batches. Memory: a window of
encoded rows per worker.

**A pass that starts part-way.** After ``batches`` batches of an epoch (a resumed run), batch ``batches`` must come
first; torch's loader asks worker 0 first, so worker ``p`` plays the part of worker ``(p + batches) % workers`` for
that pass, and each worker starts after the batches of its part already trained: whole windows it does not read, and
the rows of a partly trained window it reads and drops. The batches that follow are those of the uninterrupted run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

#: Default shuffle window of a process (split among its loader workers), in rows.
DEFAULT_WINDOW = 1 << 20


def row_hashes(keys: np.ndarray, seed: int) -> np.ndarray:
    """A stable uint64 hash of each key (numbers, strings or row numbers), different for each ``seed``."""
    import pandas as pd

    keys = np.asarray(keys)
    if keys.dtype.kind in "USb":  # fixed-width text and booleans hash as Python objects
        keys = keys.astype(object)
    hashes = pd.util.hash_array(keys, categorize=False)  # numbers mixed, strings SipHash'ed
    salt = np.uint64((seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & 0xFFFFFFFFFFFFFFFF)
    return pd.util.hash_array(hashes ^ salt, categorize=False)  # the seed's salt mixed in


def split_codes(hashes: np.ndarray, val_fraction: float, test_fraction: float) -> np.ndarray:
    """Each row's split from its hash: 0 train, 1 validation, 2 test (``uint8``)."""
    u = (hashes >> np.uint64(11)).astype(np.float64) / float(1 << 53)  # the top 53 bits: uniform in [0, 1)
    codes = np.zeros(len(hashes), dtype=np.uint8)
    codes[u < val_fraction + test_fraction] = 2
    codes[u < val_fraction] = 1
    return codes


SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


@dataclass(frozen=True)
class Segment:
    """Rows ``start:stop`` (counted among the split's rows of that row group) of row group ``group``."""

    group: int
    start: int
    stop: int


def segments(order: np.ndarray, counts: np.ndarray, start: int, stop: int) -> list[Segment]:
    """The row-group pieces of positions ``start:stop`` of the sequence that reads ``counts[order[0]]`` rows of row
    group ``order[0]``, then those of ``order[1]``, ...; in that order."""
    if stop <= start:
        return []
    ends = np.cumsum(counts[order])
    first = int(np.searchsorted(ends, start, side="right"))
    pieces = []
    for i in range(first, len(order)):
        begin = int(ends[i] - counts[order[i]])
        if begin >= stop:
            break
        low, high = max(start, begin) - begin, min(stop, int(ends[i])) - begin
        if high > low:
            pieces.append(Segment(int(order[i]), low, high))
    return pieces


def epoch_rng(seed: int, epoch: int, *more: int) -> np.random.Generator:
    """The generator of one epoch's draws (and of one process's and worker's, with ``more``)."""
    return np.random.default_rng([seed & 0xFFFFFFFF, 0x5EED, epoch, *more])


def group_order(seed: int, epoch: int, groups: int) -> np.ndarray:
    """The epoch's permutation of the row groups."""
    return epoch_rng(seed, epoch).permutation(groups)


@dataclass(frozen=True)
class TrainPlan:
    """How an epoch of ``train_rows`` train rows is shared: ``steps`` batches of ``batch_size`` per process."""

    train_rows: int
    batch_size: int
    world_size: int = 1

    @property
    def share(self) -> int:
        """Train rows of the epoch's sequence per process."""
        return self.train_rows // self.world_size

    @property
    def steps(self) -> int:
        """Batches per process and epoch (every process the same)."""
        return self.share // self.batch_size

    @property
    def remainder(self) -> int:
        """Train rows an epoch leaves out, over all processes."""
        return self.train_rows - self.steps * self.batch_size * self.world_size

    def worker_batches(self, worker: int, workers: int) -> int:
        """The batches worker ``worker`` (of ``workers``) produces in a whole pass: those ``k`` with ``k % workers ==
        worker``."""
        return len(range(worker, self.steps, workers))

    def worker_rows(self, rank: int, worker: int, workers: int) -> tuple[int, int]:
        """Positions ``start, stop`` in the epoch's sequence of the rows worker ``worker`` of process ``rank`` reads."""
        before = sum(self.worker_batches(w, workers) for w in range(worker))
        start = rank * self.share + before * self.batch_size
        return start, start + self.worker_batches(worker, workers) * self.batch_size


def window_rows(window: int, workers: int, batch_size: int) -> int:
    """A worker's shuffle window: its share of ``window`` rounded down to whole batches (at least one)."""
    return max(batch_size, (window // max(workers, 1)) // batch_size * batch_size)


def already_done(batches: int, part: int, workers: int) -> int:
    """Batches of worker part ``part`` among the first ``batches`` of a pass (those ``k < batches`` with ``k %
    workers == part``)."""
    return len(range(part, batches, workers))


def train_windows(
    plan: TrainPlan,
    counts: np.ndarray,
    *,
    seed: int,
    epoch: int,
    rank: int,
    part: int,
    workers: int,
    window: int,
    skip_batches: int = 0,
) -> Iterator[tuple[list[Segment], np.ndarray, int]]:
    """The windows worker part ``part`` of process ``rank`` reads in ``epoch``: for each, its row-group pieces (in
    reading order), the permutation of its rows and how many of the permuted rows to drop first; the windows of
    the first ``skip_batches`` batches of this part are left out (not read)."""
    order = group_order(seed, epoch, len(counts))
    start, stop = plan.worker_rows(rank, part, workers)
    size = window_rows(window, workers, plan.batch_size)
    rng = epoch_rng(seed, epoch, rank, part)
    skip_rows = skip_batches * plan.batch_size
    for begin in range(start, stop, size):
        end = min(begin + size, stop)
        permutation = rng.permutation(end - begin)  # drawn for every window, read or not: the stream stays put
        if skip_rows >= end - begin:
            skip_rows -= end - begin
            continue
        yield segments(order, counts, begin, end), permutation, skip_rows
        skip_rows = 0


def evaluation_segments(counts: np.ndarray, rank: int, world_size: int, worker: int, workers: int) -> list[Segment]:
    """The pieces of a validation, test or predict split (file order, not shuffled) one worker of one process reads:
    a contiguous share, every row exactly once over all processes and workers."""
    total = int(counts.sum())
    shares = world_size * max(workers, 1)
    index = rank * max(workers, 1) + worker
    start, stop = total * index // shares, total * (index + 1) // shares
    return segments(np.arange(len(counts)), counts, start, stop)
