"""The loop doctor's checks one by one: each works alone with a plain Trainer, and what a task expects comes from it."""

from __future__ import annotations

import inspect
import math

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule, LanguageModelModule, RegressionModule
from lightning_modules.models import MLP
from recipes.callbacks import LoopDoctor, NonFiniteError, ScheduleError
from recipes.doctor import (
    CurrentStep,
    DataWaitCheck,
    FindingsReporter,
    GradientNormCheck,
    InitialLossCheck,
    LeakageCheck,
    NonFiniteCheck,
    ScheduleCheck,
    TrainEvalModeCheck,
    UnusedParametersCheck,
)

from tests.doctor_stand_ins import ForcesTrainMode, SleepyDataset

pytestmark = [
    pytest.mark.filterwarnings("ignore::recipes.doctor.LoopDoctorWarning"),
    pytest.mark.usefixtures("one_thread"),  # tiny models: one torch thread
]


def rows(n: int, seed: int, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=generator), torch.randint(0, classes, (n,), generator=generator)


def loader(x: torch.Tensor, y: torch.Tensor, batch_size: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=batch_size)


def fit(callback: L.Callback, module: L.LightningModule, *loaders: DataLoader, **kwargs) -> L.Trainer:
    settings = dict(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    settings.update(kwargs)
    trainer = L.Trainer(**settings)
    trainer.fit(module, *loaders)
    return trainer


def classifier(classes: int = 3, scale: float = 1.0) -> ClassificationModule:
    network = MLP(2, classes, [16])
    with torch.no_grad():
        network.net[-1].weight.mul_(scale)
    return ClassificationModule(network, classes)


# --- what a task expects at initialization ----------------------------------------------------------------------
def test_tasks_say_which_initial_loss_they_expect():
    assert ClassificationModule(MLP(2, 5, [8]), 5).expected_initial_loss() == math.log(5)
    assert ClassificationModule(MLP(2, 1, [8]), 2, task="binary").expected_initial_loss() is None
    assert ClassificationModule(MLP(2, 4, [8]), 4, task="multilabel").expected_initial_loss() is None
    assert RegressionModule(MLP(2, 1, [8])).expected_initial_loss() is None
    lm = LanguageModelModule(torch.nn.Embedding(11, 11), 11)
    assert lm.expected_initial_loss() == math.log(11)
    assert lm.explain_expected_initial_loss(math.log(11)) == (
        "ln(11) = 2.398 expected at initialization for 11 vocabulary size"
    )
    five = ClassificationModule(MLP(2, 5, [8]), 5)
    assert five.explain_expected_initial_loss(math.log(5)) == "ln(5) = 1.609 expected at initialization for 5 classes"
    assert five.explain_expected_initial_loss(0.5) == "0.500 expected at initialization"  # not ln(5): no formula


class ExpectsTwoNats(RegressionModule):
    """A user's task with its own reference value."""

    def expected_initial_loss(self) -> float | None:
        return 2.0


class ExpectsNothing(ClassificationModule):
    def expected_initial_loss(self) -> float | None:
        return None


def test_a_task_that_overrides_expected_initial_loss_changes_what_the_doctor_expects():
    L.seed_everything(0)
    x = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    y = torch.zeros(32)  # an untrained network predicts about 0: MSE about 0, far below the task's 2.0
    doctor = LoopDoctor(leakage=False)
    fit(doctor, ExpectsTwoNats(MLP(2, 1, [16])), loader(x, y), max_steps=1)
    (finding,) = doctor.findings
    assert finding.check == "initial_loss" and doctor.initial_loss_value < 0.75
    assert finding.message.startswith(f"first-batch loss {doctor.initial_loss_value:.3f} vs 2.000 expected at ")
    assert "(tolerance 1.00)" in finding.message  # max(0.5 x 2.0, 0.75)

    # a classifier whose task opts out: no comparison even for a confidently wrong network
    quiet = LoopDoctor(leakage=False)
    network = MLP(2, 3, [16])
    with torch.no_grad():
        network.net[-1].weight.mul_(200.0)
    fit(quiet, ExpectsNothing(network, 3), loader(*rows(32, 0)), max_steps=1)
    assert quiet.findings == [] and quiet.initial_loss_value is None


class PlainMulticlass(L.LightningModule):
    """Not a Task: the doctor recognizes a softmax classifier by ``task`` and ``num_classes``."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.task, self.num_classes = "multiclass", 3
        self.net = MLP(2, 3, [16])
        with torch.no_grad():
            self.net.net[-1].weight.mul_(scale)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_initial_loss_check_alone_and_for_a_module_that_is_not_a_task():
    L.seed_everything(0)
    check = InitialLossCheck()
    fit(check, classifier(scale=200.0), loader(*rows(32, 0)), max_steps=1)
    (finding,) = check.findings
    assert check.initial_loss_value > 3.0
    assert f"first-batch loss {check.initial_loss_value:.3f} vs ln(3) = 1.099 expected at initialization" in (
        finding.message
    )
    plain = InitialLossCheck()
    fit(plain, PlainMulticlass(scale=200.0), loader(*rows(32, 0)), max_steps=1)
    assert plain.initial_loss_value > 3.0 and "for 3 classes (tolerance 0.75)" in plain.findings[0].message


# --- each check alone with a plain Trainer ----------------------------------------------------------------------
def test_non_finite_check_alone_stops_at_the_nan_row():
    L.seed_everything(0)
    x, y = rows(64, 0)
    x[60, 1] = float("nan")  # batch 7, row 4
    check = NonFiniteCheck()
    with pytest.raises(NonFiniteError, match=r"^non-finite loss \(nan\) at global step 7 \(epoch 0, batch 7\)"):
        fit(check, classifier(), loader(x, y))
    (finding,) = check.findings
    assert (finding.check, finding.step, finding.epoch) == ("non_finite", 7, 0)
    assert "NaN/inf in row(s) 4 of the batch" in finding.message


def test_gradient_norm_check_alone_logs_the_same_norms_as_the_loop_doctor():
    norms = {}
    for name, callback in (("alone", GradientNormCheck(every_n_steps=3)), ("doctor", None)):
        L.seed_everything(0)
        callback = callback or LoopDoctor(grad_norm_every_n_steps=3, leakage=False)
        fit(callback, classifier(), loader(*rows(80, 0)), gradient_clip_val=1.0)
        norms[name] = callback.grad_norms
    assert [step for step, _ in norms["alone"]] == [0, 3, 6, 9]  # 10 optimizer steps
    assert norms["alone"] == norms["doctor"]
    assert all(0 < norm < 10 for _, norm in norms["alone"])


def test_the_doctor_reads_the_norm_that_clipping_measured_and_measures_none_itself(monkeypatch):
    """One gradient norm per step: the task's clipping by norm keeps the norm ``clip_grad_norm_`` returns, the doctor
    keeps a reference to it; it measures one itself only where it reads before the step's clipping (the optimizer
    step of a logging step or an epoch's last batch)."""
    from recipes.doctor import current_step

    measured = []
    total_gradient_norm = current_step.total_gradient_norm
    monkeypatch.setattr(current_step, "total_gradient_norm",
                        lambda optimizer: measured.append(1) or total_gradient_norm(optimizer))
    clipped = []

    class ClipNorms(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            clipped.append(float(pl_module.gradient_norm))

    L.seed_everything(0)
    doctor = LoopDoctor(grad_norm_every_n_steps=1, leakage=False)
    fit(doctor, classifier(), loader(*rows(80, 0)), gradient_clip_val=1.0, max_epochs=2, log_every_n_steps=50,
        callbacks=[doctor, ClipNorms()])
    assert len(measured) == 2  # the last batch of each epoch (10 batches each): read before its clipping
    assert [step for step, _ in doctor.grad_norms] == list(range(20))
    assert [norm for _, norm in doctor.grad_norms] == pytest.approx(clipped, rel=1e-6)


def test_data_wait_check_alone_measures_a_sleepy_loader():
    check = DataWaitCheck(skip_batches=1)
    fit(check, classifier(), DataLoader(SleepyDataset(48, delay=0.004), batch_size=8))  # 32 ms per batch
    ((epoch, fraction),) = check.data_wait_fractions
    assert epoch == 0 and fraction > 0.5
    assert [f.check for f in check.findings] == ["data_wait"] and "num_workers=0" in check.findings[0].message


def test_leakage_check_alone_counts_copied_rows():
    x, y = rows(40, 0)
    xv, yv = rows(12, 1)
    xv[:4], yv[:4] = x[20:24], y[20:24]
    check = LeakageCheck()
    fit(check, classifier(), loader(x, y), loader(xv, yv), limit_train_batches=1, num_sanity_val_steps=0)
    assert check.leakage_overlap == 4
    assert check.findings[0].message.startswith("4 of 12 val samples (33.3%) are identical")


class OneCyclePerEpoch(ClassificationModule):
    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 1e-2, self.trainer.estimated_stepping_batches)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


def test_schedule_check_alone_fails_before_the_first_step():
    check = ScheduleCheck()
    with pytest.raises(ScheduleError, match="OneCycleLR is a per-step schedule.*move 4x too slowly"):
        fit(check, OneCyclePerEpoch(MLP(2, 3, [16]), 3), loader(*rows(32, 0)), max_epochs=2)
    assert [(f.check, f.step) for f in check.findings] == [("schedule", 0)]


def test_train_eval_mode_check_alone_reports_validation_in_train_mode():
    check = TrainEvalModeCheck()
    module = ClassificationModule(ForcesTrainMode(2, 3, [16], dropout=0.5), 3)
    fit(check, module, loader(*rows(16, 0)), loader(*rows(16, 1)), limit_val_batches=1)
    (finding,) = check.findings
    assert finding.message.startswith("validation ran with 6 module(s) in train mode (after validation_step of batch 0)")


# --- how LoopDoctor composes them -------------------------------------------------------------------------------
def test_the_doctor_holds_only_the_enabled_checks_and_forwards_only_their_hooks():
    everything = LoopDoctor()
    assert [type(part).__name__ for part in everything.parts] == [
        "CurrentStep", "TrainEvalModeCheck", "LeakageCheck", "DataWaitCheck", "NonFiniteCheck", "InitialLossCheck",
        "GradientNormCheck", "ScheduleCheck", "UnusedParametersCheck", "TrivialBaselineCheck",
    ]
    # inside the doctor the checks read the shared step: none records a batch itself
    assert "on_before_backward" not in everything.checks["non_finite"].hooks()
    assert everything.checks["non_finite"].step is everything.parts[0]

    only_norms = LoopDoctor(initial_loss=False, non_finite=False, data_wait=False, leakage=False, mode_check=False,
                            unused_parameters=False, baseline=False)
    step = only_norms.parts[0]
    # gradients only: no loss recorded in on_before_backward; the steps are kept and read at the read hooks
    assert isinstance(step, CurrentStep) and step.hooks() == (
        "on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end", "on_validation_start",
        "on_train_epoch_end", "on_train_end", "on_save_checkpoint",
    )
    assert list(only_norms.checks) == ["grad_norm", "schedule"]

    nothing = LoopDoctor(
        initial_loss=False, non_finite=False, grad_norm=False, data_wait=False, leakage=False,
        schedule_check=False, mode_check=False, unused_parameters=False, baseline=False,
    )
    assert nothing.parts == [] and nothing.grad_norms == [] and nothing.leakage_overlap is None


def test_checks_used_together_share_one_reporter():
    reporter = FindingsReporter()
    x, y = rows(40, 0)
    xv, yv = x[:8].clone(), y[:8].clone()  # every val row is a train row
    leakage, mode = LeakageCheck(reporter=reporter), TrainEvalModeCheck(reporter=reporter)
    module = ClassificationModule(ForcesTrainMode(2, 3, [16]), 3)
    fit(leakage, module, loader(x, y), loader(xv, yv), limit_train_batches=1, limit_val_batches=1,
        callbacks=[leakage, mode])
    # the sanity check's validation (mode) comes before the start of training (leakage)
    assert [(f.check, f.step) for f in reporter.findings] == [("mode", 0), ("leakage", 0)]
    assert leakage.findings is mode.findings is reporter.findings
    assert reporter.notes == [reporter.notes[0]] and reporter.notes[0].startswith("leakage check: 8 of 8 val samples")


def test_the_doctor_keeps_its_constructor():
    parameters = inspect.signature(LoopDoctor).parameters
    assert {name: p.default for name, p in parameters.items()} == {
        "initial_loss": True, "initial_loss_rel_tol": 0.5, "initial_loss_abs_tol": 0.75, "non_finite": True,
        "grad_norm": True, "grad_norm_every_n_steps": 25, "grad_norm_window": 10, "grad_norm_clip_factor": 5.0,
        "data_wait": True, "data_wait_threshold": 0.3, "data_wait_skip_batches": 3, "leakage": True,
        "leakage_max_samples": 1_000_000, "schedule_check": True, "mode_check": True,
        "unused_parameters": True, "baseline": True, "baseline_skew_threshold": 0.8,
    }


class WithSpareHead(torch.nn.Module):
    """An MLP and a second head that forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.body = MLP(2, 3, [8])
        self.spare = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def test_unused_parameters_are_named_and_frozen_ones_are_not_mistaken_for_them():
    data = loader(*rows(32, 0))
    check = UnusedParametersCheck()
    fit(check, ClassificationModule(WithSpareHead(), num_classes=3), data)
    assert check.unused == ["model.spare.weight", "model.spare.bias"]
    [finding] = check.findings
    assert finding.step == 0 and "2 trainable tensor(s) (12 parameters) got no gradient" in finding.message
    assert "model.spare.weight, model.spare.bias" in finding.message
    # frozen on purpose (the task's freeze), whether unused or used: not reported
    for frozen in (["spare"], ["spare", "body.net.0"]):
        check = UnusedParametersCheck()
        fit(check, ClassificationModule(WithSpareHead(), num_classes=3, freeze=frozen), data)
        assert check.unused == [] and check.findings == [], frozen
    doctor = LoopDoctor(unused_parameters=False)
    fit(doctor, ClassificationModule(WithSpareHead(), num_classes=3), data)
    assert "unused_parameters" not in doctor.checks


def test_data_wait_check_gives_no_loader_advice_for_tensors_in_memory():
    """Issue 57: a table held as tensors waits only on the loop's own work between steps; advice about workers and
    pinned memory would change nothing. The fraction is still measured."""
    from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch

    x, y = rows(48, 0)
    for dataset, collate in ((TensorDataset(x, y), None), (BatchedTensorDataset(x, y), keep_batch)):
        check = DataWaitCheck(threshold=1e-6, skip_batches=1)  # any wait at all would be reported
        fit(check, classifier(), DataLoader(dataset, batch_size=8, collate_fn=collate))
        assert len(check.data_wait_fractions) == 1 and check.findings == []
    check = DataWaitCheck(threshold=1e-6, skip_batches=1)
    fit(check, classifier(), DataLoader(SleepyDataset(48, delay=0.004), batch_size=8))  # computed samples: advice
    assert [f.check for f in check.findings] == ["data_wait"]
