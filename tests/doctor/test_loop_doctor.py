"""The loop doctor: one test per silent bug, each injecting it and asserting the report; a healthy run has none."""

from __future__ import annotations

import functools
import math

import lightning as L
import pytest
import torch
from jsonargparse import ArgumentParser
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, Dataset, TensorDataset

from datamodules import SpiralDataModule
from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from lightning_modules.optim.schedules import Plateau
from recipes.callbacks import LoopDoctor, LoopDoctorWarning, NonFiniteError, ScheduleError
from recipes.callbacks.run_checkpoint import RunCheckpoint
from recipes.loop_doctor import sample_hashes
from recipes.tracking.logger import RecipeLogger
from tests.conftest import mlflow_client
from tests.doctor_stand_ins import ForcesTrainMode, SleepyDataset, random_rows

pytestmark = [
    pytest.mark.filterwarnings("ignore::recipes.loop_doctor.LoopDoctorWarning"),
    pytest.mark.usefixtures("one_thread"),  # tiny models: one torch thread
]


def classifier(network: torch.nn.Module | None = None, **kwargs) -> ClassificationModule:
    return ClassificationModule(network if network is not None else MLP(2, 3, [16]), 3, **kwargs)


def trainer(doctor: LoopDoctor, *callbacks: L.Callback, **kwargs) -> L.Trainer:
    settings = dict(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[doctor, *callbacks],
    )
    settings.update(kwargs)
    return L.Trainer(**settings)


def checks(doctor: LoopDoctor) -> list[str]:
    return [f.check for f in doctor.findings]


class StepCounter(L.Callback):
    def __init__(self) -> None:
        self.optimizer_steps = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.optimizer_steps += 1


class TensorData(L.LightningDataModule):
    """Fixed train/val tensors in order (no shuffling), so a test knows which batch holds which row."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, xv: torch.Tensor, yv: torch.Tensor, batch_size: int = 8):
        super().__init__()
        self.datasets = {"train": TensorDataset(x, y), "val": TensorDataset(xv, yv)}
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["train"], batch_size=self.batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.datasets["val"], batch_size=16)


# --- a healthy run ------------------------------------------------------------------------------------------
@pytest.mark.slow  # first MLflow use in the process: importing mlflow and creating the database take ~10 s
def test_healthy_spiral_run_reports_nothing_and_logs_its_series(workdir, capsys):
    L.seed_everything(0)
    logger = RecipeLogger(experiment_name="doctor", tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    doctor = LoopDoctor(grad_norm_every_n_steps=5)
    fit = trainer(doctor, max_epochs=3, logger=logger, gradient_clip_val=1.0, log_every_n_steps=5)
    fit.fit(classifier(), SpiralDataModule(n_samples=600, batch_size=32))
    assert doctor.findings == []
    assert abs(doctor.initial_loss_value - math.log(3)) < 0.3
    assert doctor.leakage_overlap == 0
    assert [epoch for epoch, _ in doctor.data_wait_fractions] == [0, 1, 2]
    assert all(0 <= f < 0.3 for _, f in doctor.data_wait_fractions)
    assert [step for step, _ in doctor.grad_norms] == list(range(0, 42, 5))  # 14 steps x 3 epochs
    run = logger.experiment.get_run(logger.run_id)
    assert run.data.tags["doctor.findings"] == "none"
    assert not any(key.startswith("doctor.") and key != "doctor.findings" for key in run.data.tags)
    client = mlflow_client(workdir)
    assert len(client.get_metric_history(logger.run_id, "doctor/grad_norm")) == 9
    assert len(client.get_metric_history(logger.run_id, "doctor/data_wait_fraction")) == 3
    assert run.data.tags["loopwise.val_train_overlap"] == "0"  # one number: a tag, not a metric (issue 57)
    assert client.get_metric_history(logger.run_id, "doctor/val_train_overlap") == []
    out = capsys.readouterr().out
    assert "leakage check: 0 of 120 val samples" in out and "LoopDoctor: no findings" in out


# --- non-finite loss: a NaN row -----------------------------------------------------------------------------
def nan_row_data() -> TensorData:
    x, y = random_rows(64, seed=0)
    x[60, 1] = float("nan")  # batch 7 (rows 56-63) of batch size 8, row 4 of that batch
    xv, yv = random_rows(32, seed=1)
    return TensorData(x, y, xv, yv, batch_size=8)


@pytest.mark.slow  # MLflow (see above)
def test_nan_row_stops_the_run_failed_in_mlflow_with_the_last_good_checkpoint(workdir):
    L.seed_everything(0)
    logger = RecipeLogger(experiment_name="nan", tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    last = RunCheckpoint(workdir / "checkpoints", "nan", "last")
    doctor = LoopDoctor()
    fit = trainer(doctor, last, logger=logger, enable_checkpointing=True, val_check_interval=4, max_epochs=2)
    with pytest.raises(NonFiniteError) as error:
        fit.fit(classifier(), nan_row_data())
    message = str(error.value)
    assert message.startswith("non-finite loss (nan) at global step 7 (epoch 0, batch 7)")
    assert "first parameter with a non-finite gradient: model.net.0.weight" in message
    assert "NaN/inf in row(s) 4 of the batch" in message
    assert checks(doctor) == ["non_finite"] and doctor.findings[0].step == 7
    run = logger.experiment.get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags["doctor.failure"] == message[:500]
    assert run.data.tags["doctor.non_finite"] == message[:500]
    # the checkpoint written at the validation after batch 3 is the last good one: loadable, finite, untouched
    checkpoint = torch.load(last.best_model_path, weights_only=True)
    assert checkpoint["global_step"] == 4
    assert all(torch.isfinite(t).all() for t in checkpoint["state_dict"].values() if t.is_floating_point())
    restored = classifier()
    restored.load_state_dict(checkpoint["state_dict"])


def test_nan_row_without_mlflow_even_with_save_on_exception(tmp_path):
    """The guard raises before the optimizer step, so a checkpoint saved on the exception is still finite."""
    L.seed_everything(0)
    on_exception = ModelCheckpoint(dirpath=tmp_path, save_on_exception=True, save_top_k=0)
    doctor = LoopDoctor()
    fit = trainer(doctor, on_exception, enable_checkpointing=True, max_epochs=1)
    with pytest.raises(NonFiniteError, match=r"global step 7 \(epoch 0, batch 7\).*model\.net\.0\.weight"):
        fit.fit(classifier(), nan_row_data())
    saved = list(tmp_path.glob("*.ckpt"))
    assert saved
    for path in saved:
        state = torch.load(path, weights_only=True)["state_dict"]
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())


def test_a_nan_found_steps_later_names_its_step_and_no_checkpoint_of_it_is_written(tmp_path):
    """Between logging steps nothing is read: a NaN at batch 3 is found by the read before the next checkpoint save
    (one per step here), after its update. The message still names its step, batch and row; the save that would have
    written the non-finite weights is refused, and so is the save on exception."""
    L.seed_everything(0)
    x, y = random_rows(64, seed=0)
    x[28, 1] = float("nan")  # batch 3 (rows 24-31) of batch size 8, row 4 of that batch
    every_step = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1, save_on_exception=True,
                                 filename="{step}")
    doctor = LoopDoctor()
    fit = trainer(doctor, every_step, enable_checkpointing=True, max_epochs=1, log_every_n_steps=50)
    with pytest.raises(NonFiniteError) as error:
        fit.fit(classifier(), TensorData(x, y, *random_rows(16, seed=1)))
    message = str(error.value)
    assert message.startswith("non-finite loss (nan) at global step 3 (epoch 0, batch 3)")
    assert "NaN/inf in row(s) 4 of the batch" in message
    assert "Found 1 optimizer step(s) later" in message and "no checkpoint of them is written" in message
    assert doctor.findings[0].step == 3 and doctor.checks["non_finite"].step.reads >= 3
    saved = sorted(path.name for path in tmp_path.glob("*.ckpt"))
    assert saved == ["step=1.ckpt", "step=2.ckpt", "step=3.ckpt"]  # the weights before the NaN batch's update
    for path in tmp_path.glob("*.ckpt"):
        state = torch.load(path, weights_only=True)["state_dict"]
        assert all(torch.isfinite(t).all() for t in state.values() if t.is_floating_point())
    assert every_step.save_on_exception is False  # turned off for this failure; back on at the next fit's start


# --- lr = 1e3: the gradient norm before clipping ------------------------------------------------------------
def test_huge_learning_rate_is_named_by_the_gradient_norm_check():
    L.seed_everything(0)
    doctor = LoopDoctor(grad_norm_every_n_steps=1)
    module = classifier(optimizer=functools.partial(torch.optim.AdamW, lr=1e3))
    fit = trainer(doctor, max_epochs=2, gradient_clip_val=1.0, num_sanity_val_steps=0)
    with pytest.warns(LoopDoctorWarning, match=r"\[grad_norm\].*lr=1000\.0\) is the likely cause"):
        with pytest.raises(NonFiniteError, match=r"the learning rate \(lr=1000\.0\) is the likely cause"):
            fit.fit(module, SpiralDataModule(n_samples=600, batch_size=32))
    grad_norm = next(f for f in doctor.findings if f.check == "grad_norm")
    assert "5x gradient_clip_val=1.0" in grad_norm.message and grad_norm.step == 9  # the 10th step: window full
    assert doctor.grad_norms[0][1] < 5 and all(norm > 5 for _, norm in doctor.grad_norms[1:])
    assert checks(doctor) == ["grad_norm", "non_finite"]


# --- leakage: val repeats train rows ------------------------------------------------------------------------
def test_val_split_that_repeats_train_rows_is_reported():
    x, y = random_rows(64, seed=0)
    xv, yv = random_rows(20, seed=1)
    xv[:5], yv[:5] = x[10:15], y[10:15]  # five val rows copied from train
    doctor = LoopDoctor(baseline=False)  # random rows: the model is no better than the majority class
    fit = trainer(doctor, limit_train_batches=1, limit_val_batches=1)
    fit.fit(classifier(), TensorData(x, y, xv, yv))
    assert doctor.leakage_overlap == 5
    assert checks(doctor) == ["leakage"]
    assert doctor.findings[0].message.startswith("5 of 20 val samples (25.0%) are identical")


def test_leakage_through_plain_loaders_and_any_dataset():
    """No data module: the loaders' datasets are hashed, also datasets without tensors (dataset[i])."""

    class Rows(Dataset):
        def __init__(self, x, y):
            self.x, self.y = x, y

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

    x, y = random_rows(40, seed=0)
    xv, yv = random_rows(10, seed=1)
    xv[3], yv[3] = x[7], y[7]
    xv[4], yv[4] = x[8], (y[8] + 1) % 3  # same inputs, another label: a contradiction, not a leaked answer
    doctor = LoopDoctor()
    fit = trainer(doctor, limit_train_batches=1, num_sanity_val_steps=0)
    fit.fit(classifier(), DataLoader(Rows(x, y), batch_size=8), DataLoader(Rows(xv, yv), batch_size=8))
    assert doctor.leakage_overlap == 1 and checks(doctor) == ["leakage"]
    # batched tensor datasets hash to the same values as the same samples read one by one
    assert list(sample_hashes(BatchedTensorDataset(x, y))) == list(sample_hashes(Rows(x, y)))


# --- data wait: a loader that sleeps ------------------------------------------------------------------------
def test_a_loader_that_sleeps_gets_the_data_wait_hint():
    doctor = LoopDoctor(leakage=False, data_wait_skip_batches=1)
    fit = trainer(doctor, num_sanity_val_steps=0, limit_val_batches=0)
    fit.fit(classifier(), DataLoader(SleepyDataset(64, delay=0.004), batch_size=8))  # 32 ms per batch
    (epoch, fraction), = doctor.data_wait_fractions
    assert epoch == 0 and fraction > 0.5
    assert checks(doctor) == ["data_wait"]
    message = doctor.findings[0].message
    assert "waits for the next batch" in message and "num_workers=0" in message
    assert "pinned memory" in message and "in-memory" in message


# --- schedule sanity ----------------------------------------------------------------------------------------
class OneCycleStepsPerEpoch(ClassificationModule):
    """The classic: OneCycleLR sized in optimizer steps, returned without interval (Lightning's default: epoch)."""

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        total = self.trainer.estimated_stepping_batches
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-2, total)}


class CosineSizedInSteps(ClassificationModule):
    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        total = self.trainer.estimated_stepping_batches
        return [optimizer], [torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)]


@pytest.mark.parametrize(
    ("module_class", "reason"),
    [
        (OneCycleStepsPerEpoch, "OneCycleLR is a per-step schedule"),
        (CosineSizedInSteps, "CosineAnnealingLR is sized in optimizer steps (T_max=42"),
    ],
)
def test_per_step_schedule_stepped_per_epoch_fails_before_training(module_class, reason):
    doctor, counter = LoopDoctor(), StepCounter()
    fit = trainer(doctor, counter, max_epochs=3)
    with pytest.raises(ScheduleError, match="stepped once per epoch") as error:
        fit.fit(module_class(MLP(2, 3, [16]), 3), SpiralDataModule(n_samples=600, batch_size=32))
    assert reason in str(error.value) and "'interval': 'step'" in str(error.value)
    assert counter.optimizer_steps == 0 and checks(doctor) == ["schedule"]


def test_plateau_schedule_whose_monitor_is_never_logged_fails_after_the_first_validation():
    doctor, counter = LoopDoctor(), StepCounter()
    fit = trainer(doctor, counter, max_epochs=3)
    module = classifier(schedule=Plateau(monitor="val/accuracy"))
    with pytest.raises(ScheduleError, match=r"ReduceLROnPlateau monitors 'val/accuracy', which is never logged"):
        fit.fit(module, SpiralDataModule(n_samples=600, batch_size=32))
    assert "val/acc, " in doctor.findings[0].message  # the metrics that are logged
    assert counter.optimizer_steps == 14  # one epoch, before Lightning's own check at the scheduler step


def test_plateau_schedule_without_validation_fails_before_training():
    doctor, counter = LoopDoctor(), StepCounter()
    fit = trainer(doctor, counter, limit_val_batches=0)
    with pytest.raises(ScheduleError, match=r"validation never runs \(limit_val_batches=0\)"):
        fit.fit(classifier(schedule=Plateau()), SpiralDataModule(n_samples=600, batch_size=32))
    assert counter.optimizer_steps == 0


# --- mode check ---------------------------------------------------------------------------------------------
def test_forward_that_forces_train_mode_during_validation_is_reported():
    doctor = LoopDoctor()
    fit = trainer(doctor, limit_train_batches=2, limit_val_batches=2)
    fit.fit(classifier(ForcesTrainMode(2, 3, [16], dropout=0.5)), SpiralDataModule(n_samples=300, batch_size=32))
    assert checks(doctor) == ["mode"]
    message = doctor.findings[0].message
    assert message.startswith("validation ran with 6 module(s) in train mode (after validation_step of batch 0)")
    assert "model, model.net, model.net.0" in message and "dropout stays active" in message


class ForgetsTrainMode(ClassificationModule):
    def on_validation_model_train(self) -> None:  # overridden without calling .train(): stays in eval mode
        pass


@pytest.mark.parametrize(("sanity_steps", "step"), [(2, 0), (0, 2)], ids=["after-sanity-check", "after-epoch-1"])
def test_training_that_resumes_in_eval_mode_is_reported(sanity_steps, step):
    doctor = LoopDoctor(baseline=False)  # random rows: the model is no better than the majority class
    fit = trainer(doctor, max_epochs=2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=sanity_steps)
    fit.fit(ForgetsTrainMode(MLP(2, 3, [16]), 3), SpiralDataModule(n_samples=300, batch_size=32))
    assert checks(doctor) == ["mode"]
    message = doctor.findings[0].message
    assert message.startswith("training resumed after validation with 6 module(s) still in eval mode: ")
    assert "ForgetsTrainMode, model, model.net" in message
    assert doctor.findings[0].step == step


class FreezesDropoutEachEpoch(ClassificationModule):
    def on_train_epoch_start(self) -> None:
        self.model.net[2].eval()  # the old-Lightning idiom for frozen layers


def test_deliberately_frozen_modules_are_not_flagged():
    module = FreezesDropoutEachEpoch(MLP(2, 3, [16], dropout=0.5), 3)
    module.model.net[1].eval()  # frozen before fit
    doctor = LoopDoctor()
    fit = trainer(doctor, max_epochs=2, limit_train_batches=2, limit_val_batches=1)
    fit.fit(module, SpiralDataModule(n_samples=300, batch_size=32))
    assert "mode" not in checks(doctor)
    assert not module.model.net[1].training and not module.model.net[2].training and module.model.net[0].training


# --- initial loss -------------------------------------------------------------------------------------------
def test_initial_loss_far_above_ln_c_is_reported():
    network = MLP(2, 3, [16])
    with torch.no_grad():
        network.net[-1].weight.mul_(200.0)  # confidently wrong from the start
    doctor = LoopDoctor()
    fit = trainer(doctor, max_steps=1, limit_val_batches=0, num_sanity_val_steps=0)
    fit.fit(classifier(network), SpiralDataModule(n_samples=300, batch_size=32))
    assert checks(doctor) == ["initial_loss"]
    assert doctor.initial_loss_value > 3.0
    assert "vs ln(3) = 1.099 expected at initialization" in doctor.findings[0].message


def test_initial_loss_is_the_per_batch_loss_under_accumulation():
    L.seed_everything(0)
    doctor = LoopDoctor(data_wait=False)  # a single step's data wait is timing, not loss: flaky on a busy machine
    fit = trainer(doctor, max_steps=1, accumulate_grad_batches=4, limit_val_batches=0, num_sanity_val_steps=0)
    fit.fit(classifier(), SpiralDataModule(n_samples=300, batch_size=32))
    assert doctor.findings == [] and abs(doctor.initial_loss_value - math.log(3)) < 0.3


# --- configuration ------------------------------------------------------------------------------------------
def test_every_check_can_be_switched_off_and_configured_from_yaml():
    parser = ArgumentParser()
    parser.add_argument("--doctor", type=LoopDoctor)
    config = parser.parse_object(
        {
            "doctor": {
                "class_path": "recipes.callbacks.LoopDoctor",
                "init_args": {"non_finite": False, "grad_norm_every_n_steps": 5},
            }
        }
    )
    doctor = parser.instantiate_classes(config).doctor
    assert isinstance(doctor, LoopDoctor) and not doctor.non_finite and doctor.grad_norm_every_n_steps == 5
    quiet = LoopDoctor(
        initial_loss=False,
        non_finite=False,
        grad_norm=False,
        data_wait=False,
        leakage=False,
        schedule_check=False,
        mode_check=False,
        baseline=False,
    )
    fit = trainer(quiet, limit_val_batches=1)
    fit.fit(classifier(), nan_row_data())  # NaN loss, no guard: the run goes on
    assert quiet.findings == [] and quiet.leakage_overlap is None and quiet.grad_norms == []
    with pytest.raises(ValueError, match="data_wait_threshold"):
        LoopDoctor(data_wait_threshold=30)
