"""Exact evaluation under DDP: every sample of a val/test split evaluated once, by one process, with no padding.

Lightning gives each process of a distributed run a ``DistributedSampler``, which pads a split to a multiple of the
world size by repeating samples (399 val samples become 400 on 2 processes), so the synced metrics count some samples
twice. ``EvaluationShardSampler`` is each process's shard of the split without padding: process ``r`` of ``n`` takes
samples ``r, r + n, r + 2n, ...`` (the shards of a split of ``N`` samples differ by at most one sample, so by at most
one batch). It subclasses ``DistributedSampler``, so Lightning leaves it in place instead of wrapping it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset, DistributedSampler


class EvaluationShardSampler(DistributedSampler):
    """One process's share of an evaluation split: every index of the dataset in exactly one shard, none repeated.

    Process ``rank`` takes the indices ``rank, rank + num_replicas, ...`` in order (the order Lightning's predict
    sampler uses: sample ``i`` is the ``i // num_replicas``-th of process ``i % num_replicas``); with ``lengths``,
    its shard is sorted by length (stable), so batches of similar lengths need little padding. Each process must hold
    at least one sample: a process with none would skip the evaluation loop and leave the others waiting for it in the
    metrics' sync, so a dataset smaller than ``num_replicas`` (but not empty) is a ``ValueError``.

    Args:
        dataset: The split's dataset (anything with ``len``).
        num_replicas: Number of processes.
        rank: This process's rank, in ``[0, num_replicas)``.
        lengths: Optional length of every sample (tokens, say), indexed by dataset index.
        name: What the dataset is, in error messages ("SpiralDataModule's val split").
    """

    def __init__(
        self,
        dataset: Dataset | Sequence[Any],
        num_replicas: int,
        rank: int,
        lengths: Sequence[int] | Tensor | None = None,
        name: str = "the dataset",
    ) -> None:
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"EvaluationShardSampler: rank {rank} is not in [0, {num_replicas})")
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False)  # type: ignore[arg-type]
        size = len(dataset)  # type: ignore[arg-type]
        if 0 < size < num_replicas:
            raise ValueError(
                f"{name} has {size} sample(s), fewer than the {num_replicas} processes: each process must "
                f"evaluate at least one (one with none would wait forever for the others); evaluate it on at most "
                f"{size} process(es), which gives the result of any number"
            )
        # DistributedSampler's meaning: this process's number of samples, and the total over all processes
        self.num_samples = len(range(rank, size, num_replicas))
        self.total_size = size
        self.lengths = None if lengths is None else torch.as_tensor(lengths, dtype=torch.long)
        if self.lengths is not None and len(self.lengths) != size:
            raise ValueError(f"EvaluationShardSampler: {len(self.lengths)} lengths for a dataset of {size} samples")

    def __iter__(self) -> Iterator[int]:
        indices = torch.tensor(range(self.rank, self.total_size, self.num_replicas), dtype=torch.long)
        if self.lengths is not None:
            indices = indices[torch.argsort(self.lengths[indices], stable=True)]
        return iter(indices.tolist())

    def __len__(self) -> int:
        return self.num_samples


def evaluation_shard(
    dataset: Dataset, trainer: Any, lengths: Sequence[int] | Tensor | None = None, name: str = "the dataset"
) -> EvaluationShardSampler | None:
    """This process's ``EvaluationShardSampler`` of ``dataset`` when ``trainer`` runs several processes (its
    strategy's ``distributed_sampler_kwargs`` name more than one replica); ``None`` otherwise (one process, no
    trainer, or a strategy without replicas)."""
    kwargs = getattr(trainer, "distributed_sampler_kwargs", None) if trainer is not None else None
    if not kwargs or int(kwargs.get("num_replicas", 1)) <= 1:
        return None
    return EvaluationShardSampler(dataset, int(kwargs["num_replicas"]), int(kwargs["rank"]), lengths, name)


__all__ = ["EvaluationShardSampler", "evaluation_shard"]
