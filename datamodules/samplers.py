"""Samplers for imbalanced classes and variable-length sequences that stay correct under DDP.

``ClassBalancedSampler`` draws every class equally often; it is a ``DistributedSampler``, so Lightning leaves it in
place under DDP (rather than wrapping it) and each rank draws its own shard of one draw shared by all ranks.
``LengthBucketBatchSampler`` groups sequences of similar length into batches so little padding is needed; it is a
``BatchSampler``, so under DDP Lightning rebuilds it around a ``DistributedSampler`` that shards and shuffles.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import BatchSampler, Dataset, DistributedSampler, RandomSampler, Sampler

from datamodules.sampler_position import CarriesPosition, PassPosition, lazy_pass


def _resolve_replicas(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``: the given values, else the process group's, else a single process (1, 0)."""
    initialized = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialized else 1
    if rank is None:
        rank = dist.get_rank() if initialized else 0
    return num_replicas, rank


def _as_int_vector(values: Sequence[int] | Tensor, name: str, owner: str) -> Tensor:
    """``values`` as a 1-D int64 tensor; a ValueError naming the problem when they are not non-negative ints."""
    try:
        tensor = torch.as_tensor(values).cpu()
    except (TypeError, ValueError, RuntimeError) as err:
        raise ValueError(f"{owner}: {name} must be a sequence of non-negative ints ({err})") from err
    if tensor.ndim != 1:
        raise ValueError(f"{owner}: {name} must be one-dimensional, got shape {tuple(tensor.shape)}")
    if len(tensor) == 0:
        raise ValueError(f"{owner}: {name} is empty")
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ValueError(f"{owner}: {name} must be ints, got dtype {tensor.dtype}")
    tensor = tensor.long()
    negative = torch.nonzero(tensor < 0)
    if len(negative):
        pos = int(negative[0])
        raise ValueError(f"{owner}: {name} must be >= 0, got {int(tensor[pos])} at position {pos}")
    return tensor


class EpochRandomSampler(CarriesPosition, RandomSampler):
    """A ``RandomSampler`` whose permutation of epoch ``e`` is drawn from ``seed + e``; Lightning calls ``set_epoch``.

    The order of an epoch depends only on the seed and the epoch number, not on how many epochs this process has
    iterated before: a run resumed from a checkpoint sees exactly the shuffles of an uninterrupted run (a plain
    ``RandomSampler`` with a seeded generator continues that generator's stream, which a resumed process starts
    afresh). Lightning calls ``set_epoch`` on ``loader.sampler`` and on ``loader.batch_sampler.sampler`` every
    epoch. In a hand-written loop that never calls ``set_epoch``, every new pass moves to the next epoch by itself,
    so epochs are still shuffled differently (unlike ``DistributedSampler``, which repeats its order silently).
    Under DDP Lightning replaces it with a shuffling ``DistributedSampler`` (it is a ``RandomSampler``), which is
    also seeded by epoch.

    It carries its position: ``state_dict()`` is the epoch and how many indices of its order have been yielded,
    and after ``load_state_dict`` the next pass of that epoch starts there (the rest of the epoch's order, as the
    uninterrupted pass would have gone on).

    Args:
        data_source: The dataset whose indices are permuted.
        seed: Seed of the permutation; epoch ``e`` uses ``seed + e``.
    """

    def __init__(self, data_source: Sequence[object] | Dataset, seed: int = 0) -> None:
        super().__init__(data_source)  # type: ignore[arg-type]
        self.seed = seed
        self.epoch = 0
        self._epoch_given = False  # set_epoch was called since the last pass began
        self._passes = 0
        self.position = PassPosition()

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch``.

        Args:
            epoch: The epoch number.
        """
        self.epoch = epoch
        self._epoch_given = True

    def __iter__(self) -> Iterator[int]:
        return lazy_pass(self._begin_pass)

    def _begin_pass(self) -> Iterator[int]:
        if self._passes > 0 and not self._epoch_given:
            self.epoch += 1  # nobody said which epoch this is: the next one
        self._epoch_given = False
        self._passes += 1
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.data_source), generator=generator).tolist()  # type: ignore[arg-type]
        return self.position.run(order, self.epoch)



class ClassBalancedSampler(CarriesPosition, DistributedSampler):
    """Draw samples with inverse class-frequency weights, so every class is drawn equally often in expectation.

    The weight of sample ``i`` is ``1 / count(labels[i])``. Each epoch every rank makes the same draw of
    ``num_samples`` indices with ``torch.multinomial`` seeded by ``seed + epoch``, pads it (repeating from the start)
    to a multiple of ``num_replicas``, and rank ``r`` takes ``draws[r::num_replicas]``: the ranks see distinct
    shards of one draw, and ``set_epoch`` (called by Lightning every epoch) changes the draw. It subclasses
    ``DistributedSampler`` so Lightning keeps it as it is under DDP instead of wrapping it; it also works without a
    process group (one replica). ``len(sampler)`` is the number of indices per rank.

    Use it for the train split only: evaluation should see the true class distribution.

    It carries its position: ``state_dict()`` is the epoch and how many indices of this rank's shard have been
    yielded; after ``load_state_dict`` the next pass of that epoch starts there.

    Args:
        labels: Class id (a non-negative int) of every sample of the dataset, in dataset order.
        num_samples: Total number of draws per epoch over all ranks (default: the number of samples).
        replacement: Draw with replacement (default). Without replacement ``num_samples`` must not exceed the
            number of samples, and the balance is only approximate: rare samples run out.
        seed: Seed of the draw, shared by all ranks; the draw of epoch ``e`` uses ``seed + e``.
        num_replicas: Number of ranks; default: the world size of the process group, or 1 without one.
        rank: This process's rank; default: its rank in the process group, or 0 without one.
    """

    def __init__(
        self,
        labels: Sequence[int] | Tensor,
        num_samples: int | None = None,
        replacement: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        name = type(self).__name__
        label_tensor = _as_int_vector(labels, "labels", name)
        total = len(label_tensor) if num_samples is None else num_samples
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise ValueError(f"{name}: num_samples must be an int >= 1, got {num_samples!r}")
        if not replacement and total > len(label_tensor):
            raise ValueError(
                f"{name}: num_samples={total} exceeds the {len(label_tensor)} samples, which replacement=False "
                "cannot draw; set replacement=True or num_samples <= the number of samples"
            )
        num_replicas, rank = _resolve_replicas(num_replicas, rank)
        if num_replicas < 1:
            raise ValueError(f"{name}: num_replicas must be >= 1, got {num_replicas}")
        super().__init__(label_tensor, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.labels = label_tensor
        self.replacement = replacement
        self.total_draws = total
        # DistributedSampler's meaning of these two: indices per rank and the padded length of the shared draw
        self.num_samples = math.ceil(total / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.class_counts: Tensor = torch.bincount(label_tensor)
        self.weights: Tensor = 1.0 / self.class_counts[label_tensor].double()
        self.position = PassPosition()

    def draws(self, epoch: int | None = None) -> Tensor:
        """The draw shared by all ranks for ``epoch`` (default: the current one), padded to ``total_size``.

        Args:
            epoch: The epoch whose draw to return; default: the epoch set with ``set_epoch``.
        """
        epoch = self.epoch if epoch is None else epoch
        generator = torch.Generator().manual_seed(self.seed + epoch)
        drawn = torch.multinomial(self.weights, self.total_draws, self.replacement, generator=generator)
        if self.total_size > len(drawn):
            drawn = drawn.repeat(math.ceil(self.total_size / len(drawn)))[: self.total_size]
        return drawn

    def __iter__(self) -> Iterator[int]:
        return lazy_pass(lambda: self.position.run(self.shard().tolist(), self.epoch))

    def shard(self) -> Tensor:
        """This rank's indices of the current epoch's draw."""
        return self.draws()[self.rank : self.total_size : self.num_replicas]



class LengthBucketBatchSampler(CarriesPosition, BatchSampler):
    """Batches of sequences of similar length, so padding each batch to its longest sequence wastes little.

    Each epoch the indices of ``sampler`` are taken in chunks of ``batch_size * bucket_size_multiplier``; each chunk
    is sorted by length and cut into batches of ``batch_size``, and the order of all the epoch's batches is shuffled
    with ``seed + epoch`` so batches do not arrive sorted by length. Only the epoch's last chunk can end with a
    partial batch (dropped with ``drop_last``), so ``len()`` is exactly that of a ``BatchSampler``.

    The indices (which samples, in which order, on which rank) come from ``sampler``: use a ``RandomSampler`` for
    training. It follows ``BatchSampler``'s API, so under DDP Lightning rebuilds it with a shuffling
    ``DistributedSampler`` as ``sampler`` and each rank batches its own shard. Lightning calls ``set_epoch`` on that
    inner sampler, not on this one: the batch order then follows the inner sampler's epoch.

    It carries its position in batches: ``state_dict()`` is the epoch and how many of its batches have been
    yielded; after ``load_state_dict`` the next pass of that epoch starts there (the inner sampler still runs its
    whole epoch, which the buckets are made from).

    Args:
        sampler: Sampler (or iterable) of dataset indices, e.g. ``RandomSampler(dataset)``.
        batch_size: Samples per batch.
        drop_last: Drop the epoch's last batch when it has fewer than ``batch_size`` samples.
        lengths: Length of every sample of the dataset (e.g. its number of tokens), indexed by dataset index.
        bucket_size_multiplier: A bucket holds ``batch_size * bucket_size_multiplier`` samples sorted by length:
            larger buckets give less padding but less randomness in which samples share a batch.
        seed: Seed of the batch order; epoch ``e`` uses ``seed + e``.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        batch_size: int,
        drop_last: bool,
        lengths: Sequence[int] | Tensor,
        bucket_size_multiplier: int = 50,
        seed: int = 0,
    ) -> None:
        name = type(self).__name__
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"{name}: batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(drop_last, bool):
            raise ValueError(f"{name}: drop_last must be a bool, got {drop_last!r}")
        if (
            isinstance(bucket_size_multiplier, bool)
            or not isinstance(bucket_size_multiplier, int)
            or bucket_size_multiplier < 1
        ):
            raise ValueError(f"{name}: bucket_size_multiplier must be an int >= 1, got {bucket_size_multiplier!r}")
        super().__init__(sampler, batch_size, drop_last)
        self.lengths = _as_int_vector(lengths, "lengths", name)
        self.bucket_size_multiplier = bucket_size_multiplier
        self.seed = seed
        self.epoch = 0
        self.position = PassPosition()

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, which seeds the batch order, and pass it on to the inner sampler when it has ``set_epoch``.

        Args:
            epoch: The epoch number.
        """
        self.epoch = epoch
        set_inner_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_inner_epoch):
            set_inner_epoch(epoch)

    def current_epoch(self) -> int:
        """The epoch that seeds the batch order: the inner sampler's when it keeps one, else the one set here."""
        inner = getattr(self.sampler, "epoch", None)
        if callable(getattr(self.sampler, "set_epoch", None)) and isinstance(inner, int):
            return inner
        return self.epoch

    def position_epoch(self) -> int:
        """The batch order's epoch (``current_epoch``)."""
        return self.current_epoch()

    def _sorted_chunk(self, chunk: list[int]) -> list[int]:
        """The indices of one chunk sorted by length (ties keep the sampler's order)."""
        indices = torch.as_tensor(chunk, dtype=torch.long)
        bad = torch.nonzero((indices < 0) | (indices >= len(self.lengths)))
        if len(bad):
            index = int(indices[int(bad[0])])
            raise ValueError(
                f"{type(self).__name__}: the sampler yielded index {index}, but lengths has {len(self.lengths)} "
                f"entries (indices 0..{len(self.lengths) - 1}): lengths must cover the whole dataset"
            )
        order = torch.argsort(self.lengths[indices], stable=True)
        return indices[order].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        bucket = self.batch_size * self.bucket_size_multiplier  # a multiple of batch_size: no partial batches
        indices = iter(self.sampler)
        batches: list[list[int]] = []
        while chunk := list(itertools.islice(indices, bucket)):
            ordered = self._sorted_chunk(chunk)
            batches.extend(ordered[i : i + self.batch_size] for i in range(0, len(ordered), self.batch_size))
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        epoch = self.current_epoch()
        generator = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(len(batches), generator=generator).tolist()
        yield from self.position.run([batches[i] for i in order], epoch)



def padding_fraction(batches: Iterable[Sequence[int]], lengths: Sequence[int] | Tensor) -> float:
    """Fraction of positions that are padding when every batch is padded to its longest sequence.

    Args:
        batches: Batches of dataset indices, e.g. ``list(batch_sampler)``.
        lengths: Length of every sample of the dataset, indexed by dataset index.
    """
    lengths = torch.as_tensor(lengths, dtype=torch.long)
    padded = total = 0
    seen = False
    for batch in batches:
        batch_lengths = lengths[torch.as_tensor(list(batch), dtype=torch.long)]
        if len(batch_lengths) == 0:
            continue
        seen = True
        positions = len(batch_lengths) * int(batch_lengths.max())
        total += positions
        padded += positions - int(batch_lengths.sum())
    if not seen:
        raise ValueError("padding_fraction: there are no (non-empty) batches")
    return padded / total if total else 0.0
