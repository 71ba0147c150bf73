"""The mode check reads the modules' modes after a training batch only where a validation could leave them changed
(issue 32 point 2): Lightning restores the modes of right before each validation unless the LightningModule overrides
``on_validation_model_train``. Before the change it read every module's mode after every training batch."""

from __future__ import annotations

import lightning as L
import pytest

import recipes.doctor.train_eval_mode as mode_check
from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from recipes.callbacks import LoopDoctor

pytestmark = [pytest.mark.filterwarnings("ignore::recipes.loop_doctor.LoopDoctorWarning"), pytest.mark.usefixtures("one_thread")]


class ForgetsTrainMode(ClassificationModule):
    def on_validation_model_train(self) -> None:  # overridden without calling .train(): stays in eval mode
        pass


class FreezesMidEpoch(ClassificationModule):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            self.model.net[0].eval()  # frozen on purpose in the middle of an epoch; Lightning keeps it so
        return super().training_step(batch, batch_idx)


def fit(module: ClassificationModule, monkeypatch) -> tuple[LoopDoctor, list[str]]:
    reads: list[str] = []
    original = mode_check.modules_in_train_mode

    def counted(pl_module, modules=None):
        reads.append(pl_module.trainer.state.stage.value if pl_module.trainer.state.stage else "")
        return original(pl_module, modules)

    monkeypatch.setattr(mode_check, "modules_in_train_mode", counted)
    L.seed_everything(0)
    doctor = LoopDoctor(data_wait=False)  # a timing check: 4 batches an epoch are too few for it
    trainer = L.Trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=2, logger=False, callbacks=[doctor],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, SpiralDataModule(n_samples=300, batch_size=32))
    return doctor, reads


def test_a_module_that_leaves_the_restore_to_lightning_costs_no_read_per_training_batch(monkeypatch):
    assert mode_check.restores_modes_itself(ClassificationModule(MLP(2, 3, [16]), 3))
    doctor, reads = fit(ClassificationModule(MLP(2, 3, [16]), 3), monkeypatch)
    assert "mode" not in [f.check for f in doctor.findings]
    assert reads == []  # 8 training batches and 3 validations (sanity check included): no read of the modes


def test_a_module_frozen_mid_epoch_is_not_flagged(monkeypatch):
    doctor, reads = fit(FreezesMidEpoch(MLP(2, 3, [16]), 3), monkeypatch)
    assert "mode" not in [f.check for f in doctor.findings]
    assert reads == []


def test_an_override_of_on_validation_model_train_is_read_after_every_batch_and_caught(monkeypatch):
    assert not mode_check.restores_modes_itself(ForgetsTrainMode(MLP(2, 3, [16]), 3))
    doctor, reads = fit(ForgetsTrainMode(MLP(2, 3, [16]), 3), monkeypatch)
    assert [f.check for f in doctor.findings] == ["mode"]
    assert doctor.findings[0].message.startswith("training resumed after validation with 6 module(s) still in eval")
    assert reads.count("train") >= 8  # the snapshot after each training batch (and the check after validation)
