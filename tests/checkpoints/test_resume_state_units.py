"""Fast checks of what a mid-epoch checkpoint carries besides weights: the partial epoch's train metric state
(``lightning_modules/metrics/epoch_metric_state.py``) and the plateau step
(``lightning_modules/optim/plateau_step.py``, and ``recipes/callbacks/plateau_resume.py`` for checkpoints written before
it). End-to-end runs: tests/checkpoints/test_exact_resume_tabular.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from lightning_modules.metrics.deferred_metric_updates import DeferredMetricUpdates
from lightning_modules.metrics.epoch_metric_state import epoch_metric_state, restore_epoch_metric_state
from lightning_modules.optim.plateau_step import plateau_step_taken, plateau_steps_due
from recipes.callbacks.plateau_resume import PlateauStepOnResume


def collection() -> MetricCollection:
    return MetricCollection(
        {"acc": MulticlassAccuracy(num_classes=3), "f1": MulticlassF1Score(num_classes=3, average="macro")},
        prefix="train/",
    )


def batches(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 3, generator=generator), torch.randint(0, 3, (8,), generator=generator)) for _ in range(count)]


def test_a_restored_partial_epoch_computes_the_whole_epochs_metrics():
    data = batches(6)
    whole = collection()
    for outputs, targets in data:
        whole.update(outputs, targets)

    before = collection()
    updates = DeferredMetricUpdates(before.update)
    for outputs, targets in data[:4]:
        updates.add(outputs, targets)  # two of them still waiting on the device
        if len(updates) == 2:
            updates.flush()
    saved = epoch_metric_state(before, updates)
    assert len(updates) == 0  # the waiting updates were applied before the state was read
    assert set(saved) == {"acc", "f1"}

    after = collection()  # a new process
    restore_epoch_metric_state(after, saved)
    for outputs, targets in data[4:]:
        after.update(outputs, targets)
    expected, got = whole.compute(), after.compute()
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), key

    other_rank = collection()  # under DDP only rank 0 holds the (summed) state; the others start from zero
    other_rank.update(*data[0])
    restore_epoch_metric_state(other_rank, saved, rank=1)
    assert all(int(value.sum()) == 0 for value in other_rank["acc"].metric_state.values())


def _plateau(last_epoch: int) -> ReduceLROnPlateau:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    for _ in range(last_epoch):
        scheduler.step(1.0)
    return scheduler


def _trainer(scheduler, current_epoch: int, frequency: int = 1) -> SimpleNamespace:
    config = SimpleNamespace(
        scheduler=scheduler, interval="epoch", frequency=frequency, monitor="val/loss", reduce_on_plateau=True
    )
    return SimpleNamespace(lr_scheduler_configs=[config], current_epoch=current_epoch)


def test_plateau_step_taken_reads_the_count_from_the_scheduler():
    assert plateau_steps_due(0, 1) == 1 and plateau_steps_due(3, 2) == 2 and plateau_steps_due(2, 2) == 1
    scheduler = _plateau(last_epoch=2)  # epochs 0 and 1 stepped
    assert not plateau_step_taken(_trainer(scheduler, current_epoch=2), scheduler)
    assert plateau_step_taken(_trainer(scheduler, current_epoch=1), scheduler)
    assert plateau_step_taken(_trainer(scheduler, current_epoch=4, frequency=2), scheduler)
    lambda_lr = LambdaLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), lambda step: 1.0)
    assert not plateau_step_taken(_trainer(lambda_lr, current_epoch=5), lambda_lr)  # only plateau schedulers


class _Module:
    automatic_optimization = True

    def lr_scheduler_step(self, scheduler, metric) -> None:
        scheduler.step(metric)


def test_plateau_step_on_resume_adds_only_a_missing_step():
    """A checkpoint written after epoch 1's validation by an older loopwise holds 1 step (epoch 0's): the resume adds
    epoch 1's with the stored value. A new checkpoint already holds 2: nothing is added."""
    for steps_in_checkpoint, expected in ((1, 2), (2, 2)):
        scheduler = _plateau(last_epoch=steps_in_checkpoint)
        callback = PlateauStepOnResume()
        callback.load_state_dict({"pending": True, "epoch": 1, "metrics": {"val/loss": 2.0}})
        callback.on_train_start(_trainer(scheduler, current_epoch=2), _Module())
        assert scheduler.last_epoch == expected, steps_in_checkpoint
