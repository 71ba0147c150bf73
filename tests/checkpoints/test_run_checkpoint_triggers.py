"""``RunCheckpoint`` at a batch's end: Lightning's per-batch save check runs only for a checkpoint with a step or
time trigger (``every_n_steps``/``every_n_train_steps``, ``train_time_interval``); the others save after validations
and epochs only, and skip that check (about 10 us a batch, two checkpoints in every recipe)."""

from __future__ import annotations

from datetime import timedelta

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from recipes.callbacks.run_checkpoint import RunCheckpoint


def test_only_a_checkpoint_with_a_step_or_time_trigger_runs_lightnings_per_batch_check(tmp_path, monkeypatch):
    checked: list[str] = []
    lightning_check = ModelCheckpoint.on_train_batch_end

    def spy(self, trainer, pl_module, outputs, batch, batch_idx):
        checked.append(self.alias)
        lightning_check(self, trainer, pl_module, outputs, batch, batch_idx)

    monkeypatch.setattr(ModelCheckpoint, "on_train_batch_end", spy)
    best = RunCheckpoint(tmp_path, "triggers", "best", monitor="val/acc", mode="max")
    last = RunCheckpoint(tmp_path, "triggers", "last", every_n_steps=4)
    assert (best.saves_within_epochs, last.saves_within_epochs) == (False, True)
    assert RunCheckpoint(tmp_path, "t", "last", train_time_interval=timedelta(minutes=5)).saves_within_epochs
    trainer = pl.Trainer(max_epochs=1, logger=False, callbacks=[best, last], enable_progress_bar=False,
                         enable_model_summary=False)
    module = ClassificationModule(model=MLP(2, 3, hidden_sizes=[8]), num_classes=3)
    trainer.fit(module, datamodule=SpiralDataModule(n_samples=300, batch_size=32))  # 7 batches
    assert set(checked) == {"last"} and len(checked) == 6  # every batch but the epoch's last (RunCheckpoint's rule)
    assert torch.load(last.best_model_path, weights_only=True)["global_step"] == 4  # the step trigger saved
    assert best.best_model_path  # the best still saved after validation
