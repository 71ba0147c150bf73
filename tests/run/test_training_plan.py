"""The training plan: the seed's worked examples (000_97c50ee16f84892d) and the optimizer steps real runs take."""

from __future__ import annotations

import lightning as L
import pytest

import recipes.callbacks.training_plan as training_plan
from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from lightning_modules.optim.schedules import WarmupCosine
from recipes.callbacks import TrainingPlan, TrainingPlanWarning, plan_training
from recipes.tracking.logger import RecipeLogger


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread


# --- the arithmetic ----------------------------------------------------------------------------------------
def test_seed_example_10000_samples_batch_32_three_epochs():
    plan = plan_training(10_000, 32, max_epochs=3)
    assert plan.batches_per_epoch == 313
    assert plan.last_batch_size == 16
    assert plan.optimizer_steps_per_epoch == 313
    assert plan.total_optimizer_steps == 939
    assert plan.examples_seen == 30_000
    assert plan.micro_batches == 939
    assert plan.effective_batch_size == 32
    assert plan.bound_by == "max_epochs" and plan.epochs == 3


def test_seed_example_with_accumulation_4():
    plan = plan_training(10_000, 32, max_epochs=3, accumulate_grad_batches=4)
    assert plan.effective_batch_size == 128
    assert plan.optimizer_steps_per_epoch == 79  # ceil(313 / 4): the incomplete last window still steps
    assert plan.total_optimizer_steps == 237
    assert plan.micro_batches == 939  # forward/backward passes do not change
    assert plan.examples_seen == 30_000


def test_seed_example_1000_samples_batch_64_five_epochs():
    plan = plan_training(1_000, 64, max_epochs=5)
    assert (plan.batches_per_epoch, plan.last_batch_size, plan.total_optimizer_steps) == (16, 40, 80)
    assert plan.examples_seen == 5_000  # 75 batches of 64 + 5 of 40


def test_drop_last_drops_the_partial_batch():
    plan = plan_training(1_000, 64, max_epochs=5, drop_last=True)
    assert plan.batches_per_epoch == 15  # floor(1000 / 64)
    assert plan.last_batch_size == 64 and plan.dropped_per_epoch == 40
    assert plan.total_optimizer_steps == 75
    assert plan.examples_seen == 4_800
    even = plan_training(1_024, 64, max_epochs=1, drop_last=True)
    assert (even.batches_per_epoch, even.last_batch_size, even.dropped_per_epoch) == (16, 64, 0)


def test_two_devices_split_the_samples_with_padding():
    plan = plan_training(10_000, 32, max_epochs=3, world_size=2)
    assert plan.samples_per_device == 5_000
    assert (plan.batches_per_epoch, plan.last_batch_size) == (157, 8)  # 5000 = 156 x 32 + 8
    assert plan.total_optimizer_steps == 471
    assert plan.effective_batch_size == 64
    assert plan.examples_seen == 30_000
    odd = plan_training(1_001, 64, max_epochs=1, world_size=2)
    assert odd.samples_per_device == 501  # DistributedSampler repeats one sample to even out the devices
    assert odd.examples_seen == 1_002


def test_max_steps_binds_when_smaller():
    plan = plan_training(10_000, 32, max_epochs=3, max_steps=500)
    assert plan.bound_by == "max_steps" and plan.total_optimizer_steps == 500
    assert plan.epochs == pytest.approx(500 / 313)
    assert plan.examples_seen == 10_000 + 187 * 32  # one full epoch, then 187 full batches
    accumulated = plan_training(10_000, 32, max_epochs=3, max_steps=100, accumulate_grad_batches=4)
    assert accumulated.total_optimizer_steps == 100
    assert accumulated.micro_batches == 313 + 21 * 4  # 79 steps in epoch 1, 21 more of 4 batches each
    assert plan_training(10_000, 32, max_epochs=3, max_steps=939).bound_by == "max_epochs"
    assert plan_training(10_000, 32, max_epochs=3, max_steps=5_000).total_optimizer_steps == 939


def test_limit_train_batches_and_lightning_defaults():
    half = plan_training(10_000, 32, max_epochs=3, limit_train_batches=0.5)
    assert (half.batches_per_epoch, half.last_batch_size, half.total_optimizer_steps) == (156, 32, 468)
    assert plan_training(10_000, 32, max_epochs=3, limit_train_batches=100).total_optimizer_steps == 300
    assert plan_training(10_000, 32, max_epochs=None).total_optimizer_steps == 313 * 1000  # Lightning's default
    steps_only = plan_training(10_000, 32, max_epochs=None, max_steps=50)
    assert (steps_only.bound_by, steps_only.total_optimizer_steps) == ("max_steps", 50)
    endless = plan_training(10_000, 32, max_epochs=-1)
    assert endless.bound_by == "unbounded" and endless.total_optimizer_steps is None
    assert endless.as_params()["plan.total_optimizer_steps"] == "unbounded"
    with pytest.raises(ValueError, match="batch_size"):
        plan_training(100, 0, max_epochs=1)


def test_table_and_params_show_the_figures():
    plan = plan_training(10_000, 32, max_epochs=3, accumulate_grad_batches=4, warmup_steps=12)
    table = plan.table()
    for text in ("10,000", "313", "16 (drop_last=False)", "237 (3 epochs; max_epochs binds)", "128", "30,000"):
        assert text in table
    params = plan.as_params()
    assert params["plan.batches_per_epoch"] == 313 and params["plan.last_batch_size"] == 16
    assert params["plan.total_optimizer_steps"] == 237 and params["plan.effective_batch_size"] == 128
    assert params["plan.warmup_steps"] == 12 and params["plan.bound_by"] == "max_epochs"
    assert all(key.startswith("plan.") for key in params)


# --- real runs: the plan against the optimizer steps Lightning takes ---------------------------------------
class StepCounter(L.Callback):
    """Counts optimizer steps, micro-batches and samples the loop really processes."""

    def __init__(self) -> None:
        self.optimizer_steps = self.batches = self.samples = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.optimizer_steps += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batches += 1
        self.samples += len(batch[0])


def fit_spiral(plan: TrainingPlan, drop_last: bool = False, logger=False, **trainer_kwargs) -> StepCounter:
    counter = StepCounter()
    data = SpiralDataModule(n_samples=300, batch_size=32, drop_last=drop_last)  # train split: 210 samples
    model = ClassificationModule(MLP(2, 3, [16]), 3, schedule=WarmupCosine(warmup_fraction=0.1))
    kwargs = dict(
        max_epochs=2,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1,
        callbacks=[plan, counter],
    )
    kwargs.update(trainer_kwargs)
    trainer = L.Trainer(**kwargs)
    trainer.fit(model, data)
    assert trainer.global_step == counter.optimizer_steps
    return counter


@pytest.mark.parametrize(
    ("drop_last", "trainer_kwargs", "expected"),
    [
        # 210 samples, batch 32: 7 batches (6 x 32 + 18) per epoch
        (False, {}, dict(batches=7, last=18, steps=14, micro=14, seen=420)),
        (False, {"accumulate_grad_batches": 3}, dict(batches=7, last=18, steps=6, micro=14, seen=420)),
        (True, {}, dict(batches=6, last=32, steps=12, micro=12, seen=384)),
        (True, {"accumulate_grad_batches": 4}, dict(batches=6, last=32, steps=4, micro=12, seen=384)),
        (
            False,
            {"accumulate_grad_batches": 3, "max_steps": 5},
            dict(batches=7, last=18, steps=5, micro=13, seen=210 + 6 * 32),  # 3 steps in epoch 1, 2 x 3 batches
        ),
        (False, {"limit_train_batches": 0.5}, dict(batches=3, last=32, steps=6, micro=6, seen=192)),
    ],
    ids=["plain", "accumulate-3", "drop_last", "drop_last-accumulate-4", "max_steps-binds", "limit-0.5"],
)
def test_plan_matches_the_steps_lightning_takes(drop_last, trainer_kwargs, expected, capsys):
    plan = TrainingPlan()
    counter = fit_spiral(plan, drop_last=drop_last, **trainer_kwargs)
    figures = plan.figures
    assert figures is not None and plan.mismatches == []
    assert figures.train_samples == 210
    assert figures.batches_per_epoch == expected["batches"] and figures.last_batch_size == expected["last"]
    assert figures.total_optimizer_steps == expected["steps"] == counter.optimizer_steps
    assert figures.micro_batches == expected["micro"] == counter.batches
    assert figures.examples_seen == expected["seen"] == counter.samples
    assert plan.observed_optimizer_steps == counter.optimizer_steps
    assert figures.warmup_steps == round(0.1 * expected["steps"])  # WarmupCosine(warmup_fraction=0.1)
    out = capsys.readouterr().out
    assert "Training plan" in out and f"optimizer steps total    {expected['steps']}" in out
    if "max_steps" in trainer_kwargs:
        assert figures.bound_by == "max_steps"


@pytest.mark.slow  # first MLflow use in the process: importing mlflow and creating the database take ~10 s
def test_plan_is_logged_as_mlflow_params(workdir):
    logger = RecipeLogger(experiment_name="plan", tracking_uri=f"sqlite:///{workdir}/mlflow.db")
    plan = TrainingPlan()
    fit_spiral(plan, logger=logger, accumulate_grad_batches=3)
    run = logger.experiment.get_run(logger.run_id)
    params = run.data.params
    assert params["plan.train_samples"] == "210" and params["plan.batches_per_epoch"] == "7"
    assert params["plan.last_batch_size"] == "18" and params["plan.drop_last"] == "False"
    assert params["plan.optimizer_steps_per_epoch"] == "3" and params["plan.total_optimizer_steps"] == "6"
    assert params["plan.effective_batch_size"] == "96" and params["plan.bound_by"] == "max_epochs"
    assert params["plan.examples_seen"] == "420" and params["plan.warmup_steps"] == "1"
    # the same run continued with the same settings logs nothing new; with other settings the plan says so
    # (MLflow refuses to change a param, so the run keeps the first plan)
    same = TrainingPlan()
    fit_spiral(same, logger=RecipeLogger(experiment_name="plan", run_id=logger.run_id), accumulate_grad_batches=3)
    assert same.mismatches == []
    other = TrainingPlan()
    with pytest.warns(TrainingPlanWarning, match="plan.total_optimizer_steps: run has 6, now 14"):
        fit_spiral(other, logger=RecipeLogger(experiment_name="plan", run_id=logger.run_id))
    assert logger.experiment.get_run(logger.run_id).data.params["plan.total_optimizer_steps"] == "6"


def test_a_plan_that_disagrees_with_the_trainer_is_loud(monkeypatch):
    real = training_plan.plan_training

    def off_by_one(**kwargs):
        return real(**{**kwargs, "max_epochs": kwargs["max_epochs"] + 1})

    monkeypatch.setattr(training_plan, "plan_training", off_by_one)
    plan = TrainingPlan(print_table=False)
    with pytest.warns(TrainingPlanWarning) as record:
        fit_spiral(plan)
    messages = [str(w.message) for w in record]
    assert any("21 optimizer steps but trainer.estimated_stepping_batches is 14" in m for m in messages)
    assert any("the loop took 14 optimizer steps but the plan said 21" in m for m in messages)
    assert len(plan.mismatches) == 2


class BalancedSpiral(SpiralDataModule):
    """A spiral whose train split is drawn by a ClassBalancedSampler with its own number of draws."""

    def train_sampler(self, dataset):
        from datamodules.samplers import ClassBalancedSampler

        return ClassBalancedSampler(dataset.tensors[1], num_samples=100, seed=self.seed)


def test_plan_counts_the_draws_of_a_class_balanced_sampler():
    # a ClassBalancedSampler is a DistributedSampler (Lightning keeps it under DDP); its draws, not the split's 210
    # samples, make the epoch: 100 draws, batch 32 -> 4 batches (3 x 32 + 4); under DDP each rank takes ceil(100 / W)
    plan = TrainingPlan(print_table=False)
    data = BalancedSpiral(n_samples=300, batch_size=32)
    model = ClassificationModule(MLP(2, 3, [16]), 3)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=1, callbacks=[plan])
    trainer.fit(model, data)
    figures = plan.figures
    assert figures is not None and plan.mismatches == []
    assert (figures.train_samples, figures.batches_per_epoch, figures.last_batch_size) == (100, 4, 4)
    assert trainer.global_step == 4
