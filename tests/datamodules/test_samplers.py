"""Samplers: class balance, shards under real 2-process DDP, length buckets, and Lightning's re-instantiation."""

from __future__ import annotations

import json
import math
import os
import socket
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
)

from datamodules.samplers import ClassBalancedSampler, LengthBucketBatchSampler, padding_fraction

IMBALANCED = [0] * 900 + [1] * 100


# --- ClassBalancedSampler -------------------------------------------------------------------------------------------
def test_class_balanced_sampler_draws_the_minority_half_the_time():
    labels = torch.tensor(IMBALANCED)
    sampler = ClassBalancedSampler(labels, num_samples=3200, seed=0)
    assert sampler.class_counts.tolist() == [900, 100]
    assert torch.allclose(sampler.weights[:900], torch.full((900,), 1 / 900, dtype=torch.float64))
    assert torch.allclose(sampler.weights[900:], torch.full((100,), 1 / 100, dtype=torch.float64))
    assert isinstance(sampler, DistributedSampler)  # Lightning leaves DistributedSampler instances alone
    assert (sampler.num_replicas, sampler.rank, len(sampler)) == (1, 0, 3200)

    loader = DataLoader(TensorDataset(torch.arange(1000), labels), batch_size=32, sampler=sampler)
    batch_labels = [y for _, y in loader]
    assert len(batch_labels) == 100 and all(len(y) == 32 for y in batch_labels)
    minority_share = float(torch.cat(batch_labels).float().mean())
    assert abs(minority_share - 0.5) < 0.05, minority_share


def test_class_balanced_sampler_is_deterministic_per_seed_and_epoch():
    a = ClassBalancedSampler(IMBALANCED, num_samples=500, seed=3)
    b = ClassBalancedSampler(IMBALANCED, num_samples=500, seed=3)
    assert list(a) == list(b) == list(a)  # same seed and epoch, same indices, and iterating again repeats them
    other_seed = ClassBalancedSampler(IMBALANCED, num_samples=500, seed=4)
    assert list(other_seed) != list(a)
    epoch0 = list(a)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b) != epoch0
    a.set_epoch(0)
    assert list(a) == epoch0


def test_class_balanced_sampler_shards_partition_one_padded_draw():
    # 100 draws over 3 ranks: padded to 102 by repeating the first 2 draws, 34 per rank
    single = ClassBalancedSampler(IMBALANCED, num_samples=100, seed=5, num_replicas=1, rank=0)
    full = list(single)
    shards = [list(ClassBalancedSampler(IMBALANCED, num_samples=100, seed=5, num_replicas=3, rank=r)) for r in range(3)]
    assert [len(s) for s in shards] == [34, 34, 34]
    assert len(ClassBalancedSampler(IMBALANCED, num_samples=100, num_replicas=3, rank=2)) == 34
    assert Counter(sum(shards, [])) == Counter(full + full[:2])
    assert shards[1] == (full + full[:2])[1::3]


def test_class_balanced_sampler_without_replacement_is_a_permutation_subset():
    sampler = ClassBalancedSampler(IMBALANCED, num_samples=1000, replacement=False)
    assert sorted(sampler) == list(range(1000))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"labels": []}, "labels is empty"),
        ({"labels": [0, 1, -2]}, "got -2 at position 2"),
        ({"labels": [0.5, 1.0]}, "must be ints, got dtype torch.float32"),
        ({"labels": [[0, 1]]}, "one-dimensional"),
        ({"labels": [0, 1], "num_samples": 0}, "num_samples must be an int >= 1, got 0"),
        ({"labels": [0, 1], "num_samples": 3, "replacement": False}, "num_samples=3 exceeds the 2 samples"),
        ({"labels": [0, 1], "num_replicas": 2, "rank": 2}, "Invalid rank 2"),
        ({"labels": [0, 1], "num_replicas": 0, "rank": 0}, "num_replicas must be >= 1, got 0"),
    ],
)
def test_class_balanced_sampler_rejects_bad_arguments(kwargs: dict, message: str):
    with pytest.raises(ValueError, match=message):
        ClassBalancedSampler(**kwargs)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


DDP_TOTAL = 1000
DDP_SEED = 11


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One DDP rank: build the sampler from the process group alone and write its epoch 0 and 1 indices."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        sampler = ClassBalancedSampler(IMBALANCED, num_samples=DDP_TOTAL, seed=DDP_SEED)
        epoch0 = list(sampler)
        sampler.set_epoch(1)
        epoch1 = list(sampler)
        result = {
            "num_replicas": sampler.num_replicas,
            "rank": sampler.rank,
            "len": len(sampler),
            "epoch0": epoch0,
            "epoch1": epoch1,
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_class_balanced_sampler_under_two_process_ddp(tmp_path: Path):
    # two processes forked from this one (spawned interpreters would each import torch and Lightning again: ~8 CPU-s)
    mp.start_processes(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="fork")
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    per_rank = math.ceil(DDP_TOTAL / 2)
    for r, result in enumerate(ranks):
        assert (result["num_replicas"], result["rank"], result["len"]) == (2, r, per_rank)
        assert len(result["epoch0"]) == len(result["epoch1"]) == per_rank
        assert result["epoch1"] != result["epoch0"]  # set_epoch changes the draw
    assert ranks[0]["epoch0"] != ranks[1]["epoch0"]
    # the shards partition one draw shared by the ranks: the single-process draw of all DDP_TOTAL indices
    single = ClassBalancedSampler(IMBALANCED, num_samples=DDP_TOTAL, seed=DDP_SEED, num_replicas=1, rank=0)
    assert Counter(ranks[0]["epoch0"] + ranks[1]["epoch0"]) == Counter(single)
    single.set_epoch(1)
    assert Counter(ranks[0]["epoch1"] + ranks[1]["epoch1"]) == Counter(single)


# --- LengthBucketBatchSampler ---------------------------------------------------------------------------------------
N = 2000
BATCH = 32


@pytest.fixture(scope="module")
def lengths() -> list[int]:
    """N seeded random sequence lengths in [5, 200]."""
    return torch.randint(5, 201, (N,), generator=torch.Generator().manual_seed(0)).tolist()


def _random_sampler(seed: int = 0) -> RandomSampler:
    return RandomSampler(range(N), generator=torch.Generator().manual_seed(seed))


def test_length_buckets_pad_far_less_than_random_batches(lengths: list[int]):
    bucketed = list(LengthBucketBatchSampler(_random_sampler(), BATCH, False, lengths))
    random_batches = list(BatchSampler(_random_sampler(), BATCH, False))
    bucketed_fraction = padding_fraction(bucketed, lengths)
    random_fraction = padding_fraction(random_batches, lengths)
    print(f"\npadding fraction, {N} lengths in [5, 200], batch {BATCH}: "
          f"length buckets {bucketed_fraction:.4f} vs random batches {random_fraction:.4f}")
    assert random_fraction > 0.3
    assert bucketed_fraction < 0.5 * random_fraction
    assert bucketed_fraction < 0.05
    # batches do not arrive sorted by length
    maxima = [max(lengths[i] for i in b) for b in bucketed]
    assert maxima != sorted(maxima) and maxima != sorted(maxima, reverse=True)


def test_padding_fraction_counts_padded_positions():
    assert padding_fraction([[0, 1], [2]], [2, 4, 3]) == pytest.approx(2 / 11)
    assert padding_fraction([[0, 1]], [3, 3]) == 0.0
    with pytest.raises(ValueError, match="no"):
        padding_fraction([], [1, 2])


def test_length_buckets_yield_every_index_once_and_an_exact_len(lengths: list[int]):
    sampler = LengthBucketBatchSampler(_random_sampler(), BATCH, False, lengths)
    batches = list(sampler)
    assert sorted(i for b in batches for i in b) == list(range(N))
    assert len(sampler) == len(batches) == math.ceil(N / BATCH) == 63
    assert sorted(len(b) for b in batches)[1:] == [BATCH] * 62  # only one partial batch (N % 32 = 16)

    dropping = LengthBucketBatchSampler(_random_sampler(), BATCH, True, lengths)
    kept = list(dropping)
    assert len(dropping) == len(kept) == N // BATCH == 62
    assert all(len(b) == BATCH for b in kept)
    # chunks of batch_size * multiplier never leave partial batches in the middle, whatever the multiplier
    for multiplier in (1, 3, 7):
        for drop_last in (False, True):
            small = LengthBucketBatchSampler(range(250), 16, drop_last, lengths, bucket_size_multiplier=multiplier)
            got = list(small)
            assert len(small) == len(got) == (250 // 16 if drop_last else math.ceil(250 / 16))
            assert sum(len(b) < 16 for b in got) == (0 if drop_last else 1)


def test_length_buckets_are_sorted_within_a_bucket(lengths: list[int]):
    # one bucket covers all N indices: consecutive batches in sorted order never overlap in length
    sampler = LengthBucketBatchSampler(SequentialSampler(range(N)), BATCH, False, lengths, bucket_size_multiplier=63)
    ranges = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in sampler)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(ranges, ranges[1:]))


def test_length_bucket_order_changes_with_set_epoch(lengths: list[int]):
    sampler = LengthBucketBatchSampler(SequentialSampler(range(N)), BATCH, False, lengths, seed=1)
    epoch0 = list(sampler)
    assert list(sampler) == epoch0  # same epoch, same order
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0
    assert sorted(map(tuple, epoch1)) == sorted(map(tuple, epoch0))  # same batches (sequential inner sampler)
    assert sampler.epoch == 1


def test_length_buckets_shard_under_a_distributed_inner_sampler(lengths: list[int]):
    ranks = []
    for rank in range(2):
        inner = DistributedSampler(range(N), num_replicas=2, rank=rank, shuffle=True, seed=0)
        sampler = LengthBucketBatchSampler(inner, BATCH, False, lengths)
        sampler.set_epoch(2)
        assert inner.epoch == 2  # set_epoch reaches the inner sampler
        ranks.append(list(sampler))
    assert len(ranks[0]) == len(ranks[1]) == math.ceil(N / 2 / BATCH)
    indices = [{i for b in batches for i in b} for batches in ranks]
    assert not indices[0] & indices[1]
    assert indices[0] | indices[1] == set(range(N))


def test_length_bucket_order_follows_the_inner_sampler_epoch(lengths: list[int]):
    # Lightning calls set_epoch on the batch sampler's inner sampler only
    inner = DistributedSampler(range(N), num_replicas=2, rank=0, shuffle=False)
    sampler = LengthBucketBatchSampler(inner, BATCH, False, lengths)
    epoch0 = list(sampler)
    inner.set_epoch(1)
    assert list(sampler) != epoch0


def test_lightning_reinstantiates_length_buckets_around_a_distributed_sampler(lengths: list[int]):
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.pytorch.utilities.data import _update_dataloader

    dataset = TensorDataset(torch.arange(N))
    with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
        loader = DataLoader(
            dataset,
            batch_sampler=LengthBucketBatchSampler(RandomSampler(dataset), BATCH, False, lengths,
                                                   bucket_size_multiplier=10, seed=3),
        )
    distributed = DistributedSampler(dataset, num_replicas=2, rank=0)
    updated = _update_dataloader(loader, sampler=distributed)
    batch_sampler = updated.batch_sampler
    assert isinstance(batch_sampler, LengthBucketBatchSampler)
    assert batch_sampler is not loader.batch_sampler
    assert batch_sampler.sampler is distributed
    assert torch.equal(batch_sampler.lengths, torch.tensor(lengths))
    assert (batch_sampler.batch_size, batch_sampler.drop_last) == (BATCH, False)
    assert (batch_sampler.bucket_size_multiplier, batch_sampler.seed) == (10, 3)
    assert len(updated) == math.ceil(N / 2 / BATCH)
    seen = [int(i) for (x,) in updated for i in x]
    assert sorted(seen) == sorted(distributed)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size must be an int >= 1, got 0"),
        ({"bucket_size_multiplier": 0}, "bucket_size_multiplier must be an int >= 1, got 0"),
        ({"drop_last": "yes"}, "drop_last must be a bool, got 'yes'"),
        ({"lengths": [3, -1]}, "lengths must be >= 0, got -1 at position 1"),
        ({"lengths": []}, "lengths is empty"),
    ],
)
def test_length_buckets_reject_bad_arguments(kwargs: dict, message: str):
    args = {"sampler": range(2), "batch_size": 2, "drop_last": False, "lengths": [3, 4], **kwargs}
    with pytest.raises(ValueError, match=message):
        LengthBucketBatchSampler(**args)


def test_length_buckets_name_an_index_that_lengths_does_not_cover():
    sampler = LengthBucketBatchSampler(range(12), 4, False, [5] * 10)
    with pytest.raises(ValueError, match="yielded index 10, but lengths has 10 entries"):
        list(sampler)


def test_epoch_random_sampler_depends_on_seed_and_epoch_only():
    from datamodules.samplers import EpochRandomSampler

    data = list(range(50))
    sampler = EpochRandomSampler(data, seed=3)
    epoch0 = list(sampler)
    assert sorted(epoch0) == data  # a permutation
    sampler.set_epoch(0)
    assert list(sampler) == epoch0  # the same for the same epoch
    # a hand-written loop that never calls set_epoch still gets a new order each pass: the next epoch's
    again = list(sampler)
    assert again != epoch0
    sampler.set_epoch(1)
    assert list(sampler) == again
    sampler.set_epoch(4)
    epoch4 = list(sampler)
    assert epoch4 != epoch0
    fresh = EpochRandomSampler(data, seed=3)  # a new process resuming at epoch 4
    fresh.set_epoch(4)
    assert list(fresh) == epoch4
    assert list(EpochRandomSampler(data, seed=4)) != epoch0


def test_base_train_loader_built_at_a_later_epoch_shuffles_like_one_that_ran_there():
    """A resumed run builds its train loader at the restored epoch; its order must match the uninterrupted run's."""
    import torch
    from lightning.fabric.utilities.data import _set_sampler_epoch

    from datamodules.base import BaseDataModule

    class Tiny(BaseDataModule):
        def load(self):
            return torch.arange(40.0).unsqueeze(1), torch.zeros(40, dtype=torch.long)

    class FakeTrainer:
        current_epoch = 0
        strategy = type("S", (), {"root_device": torch.device("cpu")})()

    def first_epoch_order(start_epoch: int, epochs: int) -> list[list[float]]:
        dm = Tiny(batch_size=8, val_fraction=0.0, seed=1)
        dm.trainer = FakeTrainer()
        dm.trainer.current_epoch = start_epoch
        dm.setup()
        loader = dm.train_dataloader()
        orders = []
        for epoch in range(start_epoch, start_epoch + epochs):
            _set_sampler_epoch(loader, epoch)  # what Lightning's fit loop does every epoch
            orders.append(torch.cat([x for x, _ in loader]).squeeze(1).tolist())
        return orders

    straight = first_epoch_order(0, 4)
    assert len({tuple(o) for o in straight}) == 4  # every epoch reshuffles
    assert first_epoch_order(2, 2) == straight[2:]  # resumed at epoch 2: the same two epochs


def test_a_sampler_pass_counts_what_it_has_yielded_without_a_python_step_per_index():
    import itertools

    from datamodules.samplers import EpochRandomSampler

    sampler = EpochRandomSampler(list(range(30)), seed=2)
    sampler.set_epoch(1)
    order = list(sampler)
    sampler.set_epoch(1)
    passing = iter(sampler)
    assert list(itertools.islice(passing, 7)) == order[:7]
    assert sampler.state_dict() == {"epoch": 1, "position": 7}
    sampler.load_state_dict({"epoch": 1, "position": 12})  # a resume: the next pass of epoch 1 starts at 12
    assert sampler.state_dict() == {"epoch": 1, "position": 12}
    resumed = iter(sampler)
    assert next(resumed) == order[12] and sampler.state_dict() == {"epoch": 1, "position": 13}
    assert list(resumed) == order[13:] and sampler.state_dict() == {"epoch": 1, "position": 30}
