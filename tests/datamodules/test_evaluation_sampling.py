"""Exact evaluation under DDP (issue 21 part 2), in one process: the unpadded evaluation shards, the loaders the data
modules give each rank, and a val/test loss that does not depend on how the samples were batched.

The runs on 2 real processes are in ``tests/end_to_end/test_ddp_evaluation.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, SequentialSampler

from datamodules import SpiralDataModule, TextClassificationDataModule
from datamodules.evaluation_sampling import EvaluationShardSampler, evaluation_shard
from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch
from lightning_modules import ClassificationModule, LanguageModelModule
from lightning_modules.metrics.evaluation_loss import MeanLoss
from tests.conftest import REPO


def fake_trainer(world_size: int, rank: int) -> SimpleNamespace:
    """What a data module reads from its trainer: the DDP strategy's sampler arguments, epoch and device."""
    kwargs = {"num_replicas": world_size, "rank": rank} if world_size > 1 else None
    return SimpleNamespace(
        distributed_sampler_kwargs=kwargs, current_epoch=0, strategy=SimpleNamespace(root_device=torch.device("cpu"))
    )


# --- the sampler ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("size", "world"), [(399, 2), (201, 2), (400, 2), (10, 3), (7, 7), (1, 1), (0, 2)])
def test_every_index_is_in_exactly_one_shard_without_padding(size, world):
    shards = [list(EvaluationShardSampler(range(size), world, rank)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))  # each once, none added
    assert [len(EvaluationShardSampler(range(size), world, r)) for r in range(world)] == [len(s) for s in shards]
    assert max(map(len, shards)) - min(map(len, shards)) <= 1  # at most one batch more on a rank
    # rank r holds r, r + world, ...: taking one from each rank in turn gives the split's order (predict's contract)
    interleaved = [shards[i % world][i // world] for i in range(size)]
    assert interleaved == list(range(size))
    sampler = EvaluationShardSampler(range(size), world, 0)
    assert isinstance(sampler, DistributedSampler)  # Lightning leaves a DistributedSampler in place
    assert (sampler.num_samples, sampler.total_size) == (len(shards[0]), size)


def test_a_shard_with_lengths_is_sorted_by_length_and_keeps_its_samples():
    lengths = torch.tensor([5, 1, 4, 1, 3, 9, 2, 2, 8])
    for rank in range(2):
        shard = list(EvaluationShardSampler(range(9), 2, rank, lengths=lengths))
        assert sorted(shard) == list(range(rank, 9, 2))
        assert lengths[shard].tolist() == sorted(lengths[shard].tolist())
    with pytest.raises(ValueError, match="3 lengths for a dataset of 9"):
        EvaluationShardSampler(range(9), 2, 0, lengths=[1, 2, 3])


def test_a_split_smaller_than_the_world_is_refused_with_what_to_do():
    # a rank with no sample skips Lightning's evaluation loop and leaves the others waiting in the metrics' sync
    with pytest.raises(ValueError, match="X's val split has 2 sample\\(s\\), fewer than the 3 processes.*at most 2"):
        EvaluationShardSampler(range(2), 3, 0, name="X's val split")
    with pytest.raises(ValueError, match="rank 2 is not in"):
        EvaluationShardSampler(range(5), 2, 2)


def test_no_shard_without_several_processes():
    assert evaluation_shard(range(5), None) is None
    assert evaluation_shard(range(5), fake_trainer(1, 0)) is None
    assert evaluation_shard(range(5), SimpleNamespace(distributed_sampler_kwargs=None)) is None
    assert len(evaluation_shard(range(5), fake_trainer(2, 1))) == 2


# --- the loaders the data modules give each rank ---------------------------------------------------------------------
def spiral(**kwargs) -> SpiralDataModule:
    data = SpiralDataModule(n_samples=2000, n_classes=3, noise=0.2, batch_size=64, val_fraction=0.2,
                            test_fraction=0.1, seed=0, **kwargs)
    data.setup("fit")
    return data


def test_each_rank_evaluates_its_shard_of_val_and_test_and_predict_is_left_to_lightning():
    data = spiral()
    one = data.val_dataloader()
    assert isinstance(one.sampler, SequentialSampler)  # one process: the loader as before
    for split, size in (("val", 399), ("test", 201)):
        seen = []
        for rank in range(2):
            data.trainer = fake_trainer(2, rank)
            loader = getattr(data, f"{split}_dataloader")()
            assert isinstance(loader.sampler, EvaluationShardSampler) and loader.batch_size == 64
            assert loader.collate_fn is keep_batch and isinstance(loader.dataset, BatchedTensorDataset)
            assert (loader.drop_last, loader.num_workers) == (False, 0)
            inputs = torch.cat([x for x, _ in loader])
            assert len(inputs) == (size + 1 - rank) // 2
            seen.append(inputs)
        dataset = data.datasets[split]
        assert len(dataset) == size
        assert sorted(map(tuple, torch.cat(seen).tolist())) == sorted(map(tuple, dataset.tensors[0].tolist()))
        data.trainer = None
    data.trainer = fake_trainer(2, 0)
    # predict keeps its loader: Lightning shards it without padding and gathers the rows in split order
    assert isinstance(data.predict_dataloader().sampler, SequentialSampler)


def test_tiny_val_split_under_ddp_names_the_module_and_split():
    data = SpiralDataModule(n_samples=20, n_classes=2, val_fraction=0.05, test_fraction=0.0, stratify=False)
    data.setup("fit")
    assert len(data.datasets["val"]) == 1
    data.trainer = fake_trainer(2, 0)
    with pytest.raises(ValueError, match="SpiralDataModule's val split has 1 sample"):
        data.val_dataloader()


def test_length_buckets_become_each_shard_sorted_by_length():
    data = TextClassificationDataModule(path=str(REPO / "data" / "reviews.csv"), tokenizer="word", max_length=64,
                                        bucket_by_length=True, batch_size=64, val_fraction=0.2, test_fraction=0.1)
    data.setup("fit")
    dataset = data.datasets["val"]
    seen = []
    for rank in range(2):
        data.trainer = fake_trainer(2, rank)
        loader = data.val_dataloader()
        assert isinstance(loader.sampler, EvaluationShardSampler) and loader.batch_size == 64
        order = list(loader.sampler)
        assert dataset.lengths[order].tolist() == sorted(dataset.lengths[order].tolist())
        batches = list(loader)
        assert sum(len(b["labels"]) for b in batches) == len(order)
        seen += order
    assert sorted(seen) == list(range(len(dataset)))  # 799 samples: 400 + 399, none twice


# --- the loss: the same whatever the batching ------------------------------------------------------------------------
def test_mean_loss_weighs_each_batch_by_what_its_mean_was_over():
    values = torch.rand(10, dtype=torch.float64)
    weights = torch.tensor([3, 1, 0, 4, 2, 5, 1, 1, 2, 6], dtype=torch.float64)
    expected = float((values * weights).sum() / weights.sum())
    metric = MeanLoss()
    for value, weight in zip(values, weights):
        metric.update(value, weight)
    metric.update(torch.tensor(float("nan")), torch.tensor(0))  # a batch with nothing to average adds nothing
    assert float(metric.compute()) == pytest.approx(expected, rel=1e-6)
    assert metric.state_dict() == {}  # no checkpoint keys: old checkpoints load, new ones load into old code


class Rows(pl.LightningDataModule):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def val_dataloader(self):
        return DataLoader(BatchedTensorDataset(self.x, self.y), batch_size=self.batch_size, collate_fn=keep_batch)


def validate(module: pl.LightningModule, data: pl.LightningDataModule) -> dict[str, float]:
    trainer = pl.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False
    )
    return {k: float(v) for k, v in trainer.validate(module, datamodule=data, verbose=False)[0].items()}


def test_a_weighted_cross_entropy_gives_the_same_val_loss_for_any_batch_size():
    torch.manual_seed(0)
    x, y = torch.randn(23, 2), torch.randint(0, 3, (23,))
    module = ClassificationModule(nn.Linear(2, 3), num_classes=3, class_weights=[0.2, 1.0, 3.0]).eval()
    with torch.no_grad():
        expected = float(F.cross_entropy(module(x), y, weight=module.class_weights))
    results = [validate(module, Rows(x, y, batch_size)) for batch_size in (23, 4, 7)]
    for result in results:
        assert result["val/loss"] == pytest.approx(expected, rel=1e-6)  # a mean per sample it was not
        assert result["val/acc"] == results[0]["val/acc"]


class Bigram(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, vocab)

    def forward(self, ids):
        return self.embed(ids)


def test_the_language_model_val_loss_is_a_mean_over_tokens_like_its_perplexity():
    torch.manual_seed(0)
    ids = torch.randint(0, 11, (9, 6))
    targets = torch.randint(0, 11, (9, 6))
    targets[:3, 2:] = -100  # padding: batches hold different numbers of tokens
    module = LanguageModelModule(Bigram(11), vocab_size=11).eval()
    with torch.no_grad():
        expected = float(F.cross_entropy(module(ids).transpose(1, 2), targets, ignore_index=-100))
    for batch_size in (9, 2, 4):
        result = validate(module, Rows(ids, targets, batch_size))
        assert result["val/loss"] == pytest.approx(expected, rel=1e-6)
        assert result["val/ppl"] == pytest.approx(float(torch.exp(torch.tensor(expected))), rel=1e-5)
