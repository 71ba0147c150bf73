"""A train loader's position in the epoch: the samplers' and ``ResumableDataLoader``'s ``state_dict``/
``load_state_dict``, and Lightning issue 20550 (the saved position is dropped when ``configure_optimizers`` reads
``trainer.estimated_stepping_batches``) reproduced with a plain Trainer, and worked around by
``LoaderPositionOnResume``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, DistributedSampler

from datamodules.resumable_loader import ResumableDataLoader
from datamodules.samplers import ClassBalancedSampler, EpochRandomSampler, LengthBucketBatchSampler
from recipes.callbacks.loader_resume import LoaderPositionOnResume

LENGTHS = [(i * 7) % 23 + 1 for i in range(60)]


def consumed(iterable, count: int) -> list:
    iterator = iter(iterable)
    return [next(iterator) for _ in range(count)]


# --- the samplers -------------------------------------------------------------------------------------------------
SAMPLERS = {
    "epoch-random": lambda: EpochRandomSampler(range(50), seed=7),
    "class-balanced-rank-1-of-2": lambda: ClassBalancedSampler([0] * 40 + [1] * 10, seed=7, num_replicas=2, rank=1),
    "length-buckets": lambda: LengthBucketBatchSampler(
        EpochRandomSampler(range(60), seed=7), batch_size=4, drop_last=False, lengths=LENGTHS, bucket_size_multiplier=3
    ),
}


@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_a_sampler_resumed_from_its_state_yields_the_rest_of_the_epoch(make):
    uninterrupted = make()
    uninterrupted.set_epoch(3)
    epoch3 = list(uninterrupted)
    uninterrupted.set_epoch(4)
    epoch4 = list(uninterrupted)

    stopped = make()
    stopped.set_epoch(3)
    assert stopped.state_dict() == {"epoch": 3, "position": 0}
    assert consumed(stopped, 5) == epoch3[:5]
    state = stopped.state_dict()
    assert state == {"epoch": 3, "position": 5}

    resumed = make()  # a new process
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state  # pending, as loaded
    resumed.set_epoch(3)  # Lightning sets the epoch again before the pass: the position stays
    assert list(resumed) == epoch3[5:]
    assert resumed.state_dict() == {"epoch": 3, "position": len(epoch3)}
    resumed.set_epoch(4)  # the next epoch starts at its first item
    assert list(resumed) == epoch4

    other = make()
    other.load_state_dict(state)
    other.set_epoch(4)  # the position is for epoch 3's pass only: a pass of another epoch starts at 0
    assert list(other) == epoch4


@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
@pytest.mark.parametrize("state", [{"epoch": 1}, {"epoch": -1, "position": 2}, {"epoch": "x", "position": 1}])
def test_a_bad_sampler_state_is_a_value_error(make, state):
    with pytest.raises(ValueError, match="epoch"):
        make().load_state_dict(state)


# --- ResumableDataLoader ------------------------------------------------------------------------------------------
def loaders() -> dict:
    data = torch.arange(60)
    return {
        "sampler": lambda workers: ResumableDataLoader(
            data, batch_size=4, sampler=EpochRandomSampler(data, seed=3), num_workers=workers,
            persistent_workers=workers > 0,
        ),
        "batch-sampler": lambda workers: ResumableDataLoader(
            data, num_workers=workers, persistent_workers=workers > 0,
            batch_sampler=LengthBucketBatchSampler(
                EpochRandomSampler(data, seed=3), batch_size=4, drop_last=True, lengths=LENGTHS
            ),
        ),
        # what Lightning puts in place under DDP: no load_state_dict, fast-forwarded
        "distributed-sampler": lambda workers: ResumableDataLoader(
            data, batch_size=4, sampler=DistributedSampler(data, num_replicas=2, rank=1, seed=3),
            num_workers=workers, persistent_workers=workers > 0,
        ),
    }


def set_epoch(loader: DataLoader, epoch: int) -> None:
    """What Lightning does before every epoch: ``set_epoch`` on the sampler and the batch sampler's sampler."""
    for sampler in {id(s): s for s in (loader.sampler, getattr(loader.batch_sampler, "sampler", None))}.values():
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)


def as_lists(batches) -> list[list[int]]:
    return [b.tolist() for b in batches]


@pytest.mark.parametrize("workers", [0, 2], ids=["main-process", "2-workers"])
@pytest.mark.parametrize("kind", ["sampler", "batch-sampler", "distributed-sampler"])
def test_a_loader_resumed_from_its_state_hands_out_the_rest_of_the_epoch(kind, workers):
    make = loaders()[kind]
    uninterrupted = make(workers)
    set_epoch(uninterrupted, 2)
    epoch2 = as_lists(uninterrupted)

    stopped = make(workers)
    iterator = iter(stopped)
    set_epoch(stopped, 2)  # after iter(), as Lightning does: the pass begins at the first next()
    assert as_lists(consumed(iterator, 3)) == epoch2[:3]
    state = stopped.state_dict()
    assert state == {"epoch": 2, "batches": 3}  # what the loop got, not what the workers prefetched
    del iterator

    resumed = make(workers)
    resumed.load_state_dict(state)
    resumed.load_state_dict(state)  # twice is once (Lightning's own load and LoaderPositionOnResume's)
    iterator = iter(resumed)
    set_epoch(resumed, 2)
    assert as_lists(iterator) == epoch2[3:]
    assert resumed.state_dict() == {"epoch": 2, "batches": len(epoch2)}
    set_epoch(resumed, 3)  # the next epoch: from its first batch
    fresh = make(0)
    set_epoch(fresh, 3)
    assert as_lists(resumed) == as_lists(fresh)


def test_a_loader_state_of_another_epoch_is_dropped_and_bad_states_refused():
    loader = loaders()["sampler"](0)
    loader.load_state_dict({"epoch": 1, "batches": 4})
    set_epoch(loader, 2)  # e.g. the checkpoint was written at the end of epoch 1: epoch 2 starts at its first batch
    fresh = loaders()["sampler"](0)
    set_epoch(fresh, 2)
    assert as_lists(loader) == as_lists(fresh)
    for bad in ({"epoch": 1}, {"epoch": 1, "batches": -1}, {"epoch": "1", "batches": 2}):
        with pytest.raises(ValueError, match="ResumableDataLoader"):
            loader.load_state_dict(bad)


# --- Lightning issue 20550 ------------------------------------------------------------------------------------------
class Recorded(ResumableDataLoader):
    """Records the states Lightning (or anyone) loads into it."""

    loaded: list = []  # shared by the loaders of one test (reset there)

    def load_state_dict(self, state) -> None:
        Recorded.loaded.append(dict(state))
        super().load_state_dict(state)


class Counting(LightningModule):
    """Learns nothing worth knowing; records the sample numbers of every training batch."""

    def __init__(self, sized_schedule: bool) -> None:
        super().__init__()
        self.sized_schedule = sized_schedule
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, list[int]]] = []

    def train_dataloader(self):
        data = torch.arange(32)
        return Recorded(data, batch_size=4, sampler=EpochRandomSampler(data, seed=0))

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch.tolist()))
        return self.layer(batch.float().unsqueeze(1)).pow(2).mean()

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        if self.sized_schedule:  # what WarmupCosine and OneCycle do: builds the train loader now
            total = self.trainer.estimated_stepping_batches
            return [optimizer], [torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=total)]
        return optimizer


def plain_fit(tmp_path: Path, model: LightningModule, ckpt_path: str | None = None, callbacks: tuple = ()) -> None:
    trainer = Trainer(
        default_root_dir=tmp_path, accelerator="cpu", max_epochs=2, logger=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, num_sanity_val_steps=0,
        callbacks=[ModelCheckpoint(tmp_path / "ckpt", filename="{step}", every_n_train_steps=10, save_top_k=-1),
                   *callbacks],
    )
    trainer.fit(model, ckpt_path=ckpt_path)


@pytest.mark.parametrize(
    "sized_schedule, workaround, resumed_exactly",
    [(False, False, True), (True, False, False), (True, True, True)],
    ids=["lightning-loads-the-state", "issue-20550-drops-it", "loader-position-on-resume"],
)
def test_issue_20550_the_saved_loader_position_is_dropped_when_the_schedule_reads_the_run_length(
    tmp_path, sized_schedule, workaround, resumed_exactly
):
    straight = Counting(sized_schedule)
    plain_fit(tmp_path, straight)  # 2 epochs of 8 batches; step=10.ckpt is epoch 1 after its batch 1
    checkpoint = torch.load(tmp_path / "ckpt" / "step=10.ckpt", weights_only=True)
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 2}]

    Recorded.loaded = []
    resumed = Counting(sized_schedule)
    callbacks = (LoaderPositionOnResume(),) if workaround else ()
    plain_fit(tmp_path / "again", resumed, str(tmp_path / "ckpt" / "step=10.ckpt"), callbacks)
    rest = straight.seen[10:]
    if resumed_exactly:
        assert Recorded.loaded and Recorded.loaded[-1] == {"epoch": 1, "batches": 2}
        assert resumed.seen == rest
    else:  # the trap: nothing loaded into the loader, the epoch's data restarts at its first batch
        assert Recorded.loaded == []
        assert resumed.seen == straight.seen[8:14] and resumed.seen != rest
