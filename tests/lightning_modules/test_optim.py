"""Learning-rate schedules and optimizer parameter groups, checked against real ``Trainer.fit`` runs.

Every schedule test trains a tiny MLP on a few generated batches and records the learning rate that each
optimizer step actually used (``on_before_optimizer_step``), then compares it with numbers computed here.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, OneCycleLR, ReduceLROnPlateau
from torch.utils.data import DataLoader, TensorDataset

from datamodules.spiral import SpiralDataModule
from lightning_modules.classification import ClassificationModule
from lightning_modules.models.mlp import MLP
from lightning_modules.optim.parameter_groups import param_groups
from lightning_modules.optim.schedules import Constant, OneCycle, Plateau, WarmupCosine

BASE_LR = 0.05


# --- helpers ------------------------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _restore_global_torch_state():
    """``deterministic=True`` flips a process-wide torch flag; put it back so other test files are unaffected."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.manual_seed(0)
    yield
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


class LRRecorder(Callback):
    """Records the LR used by every optimizer step, at every micro-batch start and at every epoch start."""

    def __init__(self) -> None:
        self.step_indices: list[int] = []  # trainer.global_step when the optimizer is about to step
        self.step_lrs: list[float] = []  # param_groups[0]["lr"] used by that optimizer step
        self.step_group_lrs: list[list[float]] = []  # the LR of every param group at that step
        self.batch_records: list[tuple[int, int, float]] = []  # (epoch, global_step, lr) at each micro-batch
        self.epoch_lrs: list[float] = []

    @staticmethod
    def _lr(trainer: Trainer) -> float:
        return trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.epoch_lrs.append(self._lr(trainer))

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.batch_records.append((trainer.current_epoch, trainer.global_step, self._lr(trainer)))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.step_indices.append(trainer.global_step)
        self.step_lrs.append(optimizer.param_groups[0]["lr"])
        self.step_group_lrs.append([group["lr"] for group in optimizer.param_groups])


def make_trainer(callbacks=(), **kwargs) -> Trainer:
    options = dict(
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
        deterministic=True,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    options.update(kwargs)
    return Trainer(callbacks=list(callbacks), **options)


def make_loader(n_batches: int, batch_size: int = 4) -> DataLoader:
    """A fixed, unshuffled 2-feature / 3-class loader with exactly ``n_batches`` full batches."""
    generator = torch.Generator().manual_seed(0)
    n = n_batches * batch_size
    x = torch.randn(n, 2, generator=generator)
    y = torch.randint(0, 3, (n,), generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=False)


def make_module(schedule=None, lr: float = BASE_LR, **kwargs) -> ClassificationModule:
    return ClassificationModule(
        MLP(2, 3, [16]),
        num_classes=3,
        optimizer=functools.partial(torch.optim.AdamW, lr=lr),
        schedule=schedule,
        **kwargs,
    )


def ref(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Reference warmup-cosine multiplier, written independently of the library."""
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def only_scheduler(trainer: Trainer):
    assert len(trainer.lr_scheduler_configs) == 1
    return trainer.lr_scheduler_configs[0]


# --- 1. WarmupCosine ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("schedule_kwargs", "trainer_kwargs", "n_batches", "expected_total", "expected_warmup"),
    [
        pytest.param(dict(warmup_steps=3), dict(max_epochs=3), 10, 30, 3, id="warmup3-max_epochs"),
        pytest.param(dict(warmup_steps=0, min_lr_ratio=0.1), dict(max_epochs=2), 10, 20, 0, id="no-warmup-min0.1"),
        pytest.param(dict(warmup_steps=5, min_lr_ratio=0.2), dict(max_steps=17), 10, 17, 5, id="max_steps"),
        pytest.param(
            dict(warmup_fraction=0.25, min_lr_ratio=0.05), dict(max_epochs=4), 10, 40, 10, id="warmup_fraction"
        ),
        pytest.param(
            dict(warmup_steps=2, min_lr_ratio=0.1),
            dict(max_epochs=3, accumulate_grad_batches=4),
            10,
            9,  # ceil(10 / 4) = 3 optimizer steps per epoch
            2,
            id="accumulate4",
        ),
        pytest.param(
            dict(warmup_steps=0, min_lr_ratio=0.3),
            dict(max_steps=5, accumulate_grad_batches=4),
            10,
            5,
            0,
            id="accumulate4-max_steps",
        ),
        pytest.param(
            dict(warmup_steps=2, min_lr_ratio=0.1), dict(max_epochs=-1, max_steps=7), 10, 7, 2, id="endless-epochs-max_steps"
        ),
        pytest.param(
            dict(warmup_steps=1, min_lr_ratio=0.5),
            dict(max_epochs=2, limit_train_batches=4, accumulate_grad_batches=3),
            10,
            4,  # ceil(4 / 3) = 2 per epoch
            1,
            id="limit_train_batches-accumulate3",
        ),
    ],
)
def test_warmup_cosine_matches_reference_at_every_optimizer_step(
    schedule_kwargs, trainer_kwargs, n_batches, expected_total, expected_warmup
):
    min_ratio = schedule_kwargs.get("min_lr_ratio", 0.0)
    recorder = LRRecorder()
    module = make_module(WarmupCosine(**schedule_kwargs))
    trainer = make_trainer([recorder], **trainer_kwargs)
    trainer.fit(module, train_dataloaders=make_loader(n_batches))

    total = trainer.estimated_stepping_batches
    assert total == expected_total
    assert module.schedule.resolved_warmup_steps(total) == expected_warmup
    config = only_scheduler(trainer)
    assert isinstance(config.scheduler, LambdaLR)
    assert config.interval == "step"

    # one record per optimizer step, steps 0..total-1, and the LR each one used follows the reference formula
    assert recorder.step_indices == list(range(expected_total))
    assert trainer.global_step == expected_total
    expected = [BASE_LR * ref(step, expected_warmup, expected_total, min_ratio) for step in range(expected_total)]
    assert recorder.step_lrs == pytest.approx(expected, rel=1e-6, abs=1e-12)
    # both parameter groups follow the same schedule
    for step, group_lrs in enumerate(recorder.step_group_lrs):
        assert len(group_lrs) == 2
        assert group_lrs == pytest.approx([expected[step]] * 2, rel=1e-6, abs=1e-12)
    # spot checks of the shape: start of the run, end of warmup, last step above the floor
    assert recorder.step_lrs[0] == pytest.approx(BASE_LR if expected_warmup == 0 else 0.0, abs=1e-12)
    assert recorder.step_lrs[expected_warmup] == pytest.approx(BASE_LR, rel=1e-6)
    assert BASE_LR * min_ratio < recorder.step_lrs[-1] < BASE_LR


def test_warmup_cosine_with_accumulation_changes_lr_only_when_the_optimizer_steps():
    """10 micro-batches per epoch, accumulate 4: optimizer steps after micro-batches 4, 8 and 10 of every epoch."""
    recorder = LRRecorder()
    module = make_module(WarmupCosine(warmup_steps=2, min_lr_ratio=0.1))
    trainer = make_trainer([recorder], max_epochs=3, accumulate_grad_batches=4)
    trainer.fit(module, train_dataloaders=make_loader(10))

    total = 9
    assert trainer.estimated_stepping_batches == total
    records = recorder.batch_records
    assert len(records) == 30  # every micro-batch ran
    # the optimizer-step counter seen at each micro-batch start: windows of 4, 4 and 2 micro-batches per epoch
    windows = [0] * 4 + [1] * 4 + [2] * 2 + [3] * 4 + [4] * 4 + [5] * 2 + [6] * 4 + [7] * 4 + [8] * 2
    assert [step for _, step, _ in records] == windows
    # within a window the LR is constant, and it is the LR of that window's optimizer step
    for _, step, lr in records:
        assert lr == pytest.approx(BASE_LR * ref(step, 2, total, 0.1), rel=1e-6, abs=1e-12)
    for (_, step_a, lr_a), (_, step_b, lr_b) in zip(records, records[1:]):
        if step_a == step_b:
            assert lr_a == lr_b
        else:
            assert step_b == step_a + 1
    # distinct optimizer steps == estimated_stepping_batches, and the scheduler stepped once per optimizer step
    assert len(set(recorder.step_indices)) == len(recorder.step_indices) == total
    assert len({step for _, step, _ in records}) == total
    assert only_scheduler(trainer).scheduler.last_epoch == total


# --- 2. OneCycle --------------------------------------------------------------------------------------------
ONE_CYCLE = dict(pct_start=0.3, div_factor=25.0, final_div_factor=1e4)


def _check_one_cycle_run(trainer: Trainer, recorder: LRRecorder, expected_total: int, max_lr: float) -> None:
    total = trainer.estimated_stepping_batches
    assert total == expected_total
    scheduler = only_scheduler(trainer).scheduler
    assert isinstance(scheduler, OneCycleLR)
    assert scheduler.total_steps == total
    assert trainer.global_step == total
    assert recorder.step_indices == list(range(total))
    assert scheduler.last_epoch == total  # stepped exactly once per optimizer step
    lrs = recorder.step_lrs
    initial_lr = max_lr / ONE_CYCLE["div_factor"]
    final_lr = initial_lr / ONE_CYCLE["final_div_factor"]
    assert lrs[0] == pytest.approx(initial_lr, rel=1e-6)
    assert max(lrs) == pytest.approx(max_lr, rel=0.02)
    peak = lrs.index(max(lrs))
    assert abs(peak - (ONE_CYCLE["pct_start"] * total - 1)) <= 1
    assert all(a <= b for a, b in zip(lrs[: peak + 1], lrs[1 : peak + 1]))  # rises to the peak
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1 :]))  # then only falls
    assert lrs[-1] == pytest.approx(final_lr, rel=1e-6)  # the last optimizer step uses max_lr / (div * final_div)


@pytest.mark.parametrize(
    ("n_batches", "accumulate", "max_epochs", "expected_total"),
    [
        pytest.param(10, 1, 2, 20, id="no-accumulation"),
        pytest.param(10, 3, 3, 12, id="accumulate3-10-batches"),  # ceil(10 / 3) = 4 per epoch
    ],
)
def test_one_cycle_runs_exactly_the_planned_steps(n_batches, accumulate, max_epochs, expected_total):
    recorder = LRRecorder()
    module = make_module(OneCycle(**ONE_CYCLE))  # max_lr defaults to the optimizer's LR
    trainer = make_trainer([recorder], max_epochs=max_epochs, accumulate_grad_batches=accumulate)
    trainer.fit(module, train_dataloaders=make_loader(n_batches))  # would raise "Tried to step X times" on overrun
    assert trainer.current_epoch == max_epochs
    _check_one_cycle_run(trainer, recorder, expected_total, BASE_LR)


def test_one_cycle_with_drop_last_on_the_data_module():
    # 300 samples, 3 classes, val 0.2, test 0.1 -> 70 train samples per class = 210; 210 / 16 = 13.125
    datamodule = SpiralDataModule(n_samples=300, batch_size=16, drop_last=True, seed=0)
    recorder = LRRecorder()
    max_lr = 0.02
    module = make_module(OneCycle(max_lr=max_lr, **ONE_CYCLE))
    trainer = make_trainer([recorder], max_epochs=2)
    trainer.fit(module, datamodule=datamodule)
    assert datamodule.split_sizes["train"] == 210
    assert trainer.num_training_batches == 13  # the incomplete batch is dropped
    assert len(recorder.batch_records) == 26
    _check_one_cycle_run(trainer, recorder, 26, max_lr)


# --- 3. Plateau ---------------------------------------------------------------------------------------------
class FlatMetricModule(ClassificationModule):
    """Logs a validation metric that never improves, next to the usual ones."""

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("val/flat", 1.0, on_step=False, on_epoch=True, batch_size=len(batch[0]))


class ScriptedAccModule(ClassificationModule):
    """Logs ``val/acc`` from a fixed per-epoch script instead of the real accuracy."""

    def __init__(self, script, **kwargs):
        super().__init__(**kwargs)
        self.script = script

    def validation_step(self, batch, batch_idx):
        self.log("val/acc", float(self.script[self.current_epoch]), on_step=False, on_epoch=True, batch_size=1)


def _plateau_trainer(recorder, max_epochs):
    return make_trainer([recorder], max_epochs=max_epochs, limit_val_batches=1.0)


def test_plateau_lowers_lr_after_patience_epochs_without_improvement():
    recorder = LRRecorder()
    module = FlatMetricModule(
        MLP(2, 3, [16]),
        num_classes=3,
        optimizer=functools.partial(torch.optim.AdamW, lr=BASE_LR),
        schedule=Plateau(monitor="val/flat", mode="min", factor=0.5, patience=2),
    )
    trainer = _plateau_trainer(recorder, max_epochs=8)
    loader = make_loader(2)
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=make_loader(1))

    config = only_scheduler(trainer)
    assert isinstance(config.scheduler, ReduceLROnPlateau)
    assert config.interval == "epoch"
    assert config.monitor == "val/flat"
    # epoch 0 sets the best value; epochs 1, 2, 3 do not improve -> after epoch 3 (3 > patience) LR halves;
    # epochs 4, 5, 6 do not improve -> after epoch 6 it halves again.
    lr = BASE_LR
    assert recorder.epoch_lrs == pytest.approx([lr, lr, lr, lr, lr / 2, lr / 2, lr / 2, lr / 4], rel=1e-9)
    # the LR never changes inside an epoch
    for epoch, _, batch_lr in recorder.batch_records:
        assert batch_lr == pytest.approx(recorder.epoch_lrs[epoch], rel=1e-9)
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(lr / 4, rel=1e-9)
    assert all(group["lr"] == pytest.approx(lr / 4, rel=1e-9) for group in trainer.optimizers[0].param_groups)


def test_plateau_defaults_to_the_task_monitor_and_mode():
    module = make_module(Plateau(factor=0.5, patience=0))
    assert (module.monitor, module.monitor_mode) == ("val/acc", "max")
    trainer = make_trainer(max_steps=1, limit_val_batches=1.0)
    trainer.fit(module, train_dataloaders=make_loader(1), val_dataloaders=make_loader(1))
    config = only_scheduler(trainer)
    assert config.monitor == "val/acc"
    assert config.scheduler.mode == "max"
    assert config.scheduler.factor == 0.5

    # a task whose monitor is a loss gets mode "min"
    module = make_module(Plateau(), monitor="val/loss")
    trainer = make_trainer(max_steps=1, limit_val_batches=1.0)
    trainer.fit(module, train_dataloaders=make_loader(1), val_dataloaders=make_loader(1))
    config = only_scheduler(trainer)
    assert config.monitor == "val/loss"
    assert config.scheduler.mode == "min"


def test_plateau_on_its_own_metric_takes_that_metrics_direction():
    # the task monitors val/acc (max); a Plateau watching val/loss must reduce when the loss stops falling
    module = make_module(Plateau(monitor="val/loss", factor=0.5, patience=0))
    assert module.monitor_mode == "max"
    trainer = make_trainer(max_steps=1, limit_val_batches=1.0)
    trainer.fit(module, train_dataloaders=make_loader(1), val_dataloaders=make_loader(1))
    config = only_scheduler(trainer)
    assert (config.monitor, config.scheduler.mode) == ("val/loss", "min")
    # an explicit mode still wins
    module = make_module(Plateau(monitor="val/loss", mode="max"))
    trainer = make_trainer(max_steps=1, limit_val_batches=1.0)
    trainer.fit(module, train_dataloaders=make_loader(1), val_dataloaders=make_loader(1))
    assert only_scheduler(trainer).scheduler.mode == "max"


@pytest.mark.parametrize(
    ("script", "expected_factors"),
    [
        pytest.param([0.1, 0.2, 0.3, 0.4, 0.5], [1, 1, 1, 1, 1], id="rising-acc-keeps-lr"),
        pytest.param([0.5, 0.4, 0.3, 0.2, 0.1], [1, 1, 0.5, 0.25, 0.125], id="falling-acc-lowers-lr"),
    ],
)
def test_plateau_default_mode_treats_higher_acc_as_better(script, expected_factors):
    recorder = LRRecorder()
    module = ScriptedAccModule(
        script,
        model=MLP(2, 3, [16]),
        num_classes=3,
        optimizer=functools.partial(torch.optim.AdamW, lr=BASE_LR),
        schedule=Plateau(factor=0.5, patience=0),
    )
    trainer = _plateau_trainer(recorder, max_epochs=len(script))
    trainer.fit(module, train_dataloaders=make_loader(1), val_dataloaders=make_loader(1))
    assert recorder.epoch_lrs == pytest.approx([BASE_LR * f for f in expected_factors], rel=1e-9)


def test_plateau_with_validation_every_second_epoch():
    recorder = LRRecorder()
    module = ScriptedAccModule(
        [0.5, 0.5, 0.4, 0.4, 0.3, 0.3],  # only epochs 1, 3, 5 are validated: 0.5, 0.4, 0.3 -> never improves
        model=MLP(2, 3, [16]),
        num_classes=3,
        optimizer=functools.partial(torch.optim.AdamW, lr=BASE_LR),
        schedule=Plateau(factor=0.5, patience=0),
    )
    trainer = make_trainer([recorder], max_epochs=6, limit_val_batches=1.0, check_val_every_n_epoch=2)
    trainer.fit(module, train_dataloaders=make_loader(1), val_dataloaders=make_loader(1))
    # patience counts validations: the first sets the best, each later one lowers the LR once
    lr = BASE_LR
    assert recorder.epoch_lrs == pytest.approx([lr, lr, lr, lr, lr / 2, lr / 2], rel=1e-9)


# --- 4. schedules that need a finite run ----------------------------------------------------------------------
@pytest.mark.parametrize("schedule", [WarmupCosine(warmup_steps=2), OneCycle()], ids=["WarmupCosine", "OneCycle"])
def test_schedule_needing_total_steps_rejects_an_infinite_run_before_training(schedule):
    recorder = LRRecorder()
    module = make_module(schedule)
    before = [p.detach().clone() for p in module.parameters()]
    trainer = make_trainer([recorder], max_epochs=-1, max_steps=-1)
    with pytest.raises(ValueError, match=r"(?s)max_epochs.*max_steps") as excinfo:
        trainer.fit(module, train_dataloaders=make_loader(2))
    assert type(schedule).__name__ in str(excinfo.value)
    assert recorder.step_indices == []
    assert recorder.batch_records == []
    assert trainer.global_step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_schedule_needing_total_steps_rejects_a_run_without_train_batches():
    recorder = LRRecorder()
    module = make_module(WarmupCosine())
    trainer = make_trainer([recorder], max_epochs=2, limit_train_batches=0)
    with pytest.raises(ValueError, match=r"WarmupCosine needs at least one optimizer step"):
        trainer.fit(module, train_dataloaders=make_loader(2))
    assert recorder.step_indices == []


def test_constant_and_plateau_do_not_need_a_finite_run():
    assert Constant.needs_total_steps is False
    assert Plateau.needs_total_steps is False
    assert WarmupCosine.needs_total_steps is True
    assert OneCycle.needs_total_steps is True
    # an infinite run with a constant LR is fine: stop it after 3 steps with a callback
    recorder = LRRecorder()

    class StopAfter3(Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step >= 3:
                trainer.should_stop = True

    module = make_module(Constant())
    trainer = make_trainer([recorder, StopAfter3()], max_epochs=-1, max_steps=-1)
    trainer.fit(module, train_dataloaders=make_loader(2))
    assert trainer.lr_scheduler_configs == []
    assert recorder.step_lrs[:3] == [BASE_LR] * 3


# --- 5. parameter groups ----------------------------------------------------------------------------------------
class LayerZoo(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.conv = nn.Conv2d(1, 4, 3)
        self.conv_nobias = nn.Conv1d(4, 4, 1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.bn1d = nn.BatchNorm1d(4)
        self.ln = nn.LayerNorm(4)
        self.ln2d = nn.LayerNorm([4, 4])  # a norm weight with two dimensions: still no decay
        self.gn = nn.GroupNorm(2, 4)
        self.lin = nn.Linear(4, 3)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # tied: must appear once
        self.frozen = nn.Linear(3, 3)
        self.frozen.requires_grad_(False)
        self.frozen_bn = nn.BatchNorm1d(3)
        self.frozen_bn.requires_grad_(False)
        self.scale = nn.Parameter(torch.ones(1))  # 1-D free parameter: no decay


DECAY = {"emb.weight", "conv.weight", "conv_nobias.weight", "lin.weight"}
NO_DECAY = {
    "conv.bias",
    "bn.weight",
    "bn.bias",
    "bn1d.weight",
    "bn1d.bias",
    "ln.weight",
    "ln.bias",
    "ln2d.weight",
    "ln2d.bias",
    "gn.weight",
    "gn.bias",
    "lin.bias",
    "scale",
}


def _names_by_id(model: nn.Module) -> dict[int, str]:
    # named_parameters() drops the tied duplicate (head.weight is emb.weight) and keeps the first name
    return {id(p): name for name, p in model.named_parameters()}


def test_param_groups_split_decay_and_no_decay():
    model = LayerZoo()
    groups = param_groups(model)
    names = _names_by_id(model)
    assert [g["name"] for g in groups] == ["decay", "no_decay"]
    assert "weight_decay" not in groups[0]  # the optimizer's configured decay applies
    assert groups[1]["weight_decay"] == 0.0

    grouped = [id(p) for g in groups for p in g["params"]]
    assert len(grouped) == len(set(grouped)), "a parameter appears twice"
    assert {names[i] for i in grouped} == DECAY | NO_DECAY  # nothing missing, frozen ones excluded
    assert {names[id(p)] for p in groups[0]["params"]} == DECAY
    assert {names[id(p)] for p in groups[1]["params"]} == NO_DECAY
    frozen = {id(p) for p in model.parameters() if not p.requires_grad}
    assert len(frozen) == 4 and not frozen & set(grouped)

    optimizer = torch.optim.AdamW(groups, lr=1e-3, weight_decay=0.05)  # also rejects duplicates across groups
    decay_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert set(decay_of) == set(grouped)
    for pid, wd in decay_of.items():
        name = names[pid]
        module_name, _, leaf = name.rpartition(".")
        module = model.get_submodule(module_name) if module_name else model
        if leaf == "bias" or isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)):
            assert wd == 0.0, name
        elif isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)):
            assert wd == 0.05, name
        else:
            assert name == "scale" and wd == 0.0


def test_param_groups_of_a_model_with_only_decayed_or_only_frozen_parameters():
    assert [g["name"] for g in param_groups(nn.Linear(3, 3, bias=False))] == ["decay"]
    assert [g["name"] for g in param_groups(nn.LayerNorm(3))] == ["no_decay"]
    assert param_groups(nn.Linear(3, 3).requires_grad_(False)) == []


def test_classification_module_optimizer_uses_the_two_groups():
    module = ClassificationModule(
        MLP(2, 3, [16], norm="layer"),
        num_classes=3,
        optimizer=functools.partial(torch.optim.AdamW, lr=BASE_LR, weight_decay=0.05),
    )
    trainer = make_trainer(max_steps=1)
    trainer.fit(module, train_dataloaders=make_loader(1))
    (optimizer,) = trainer.optimizers
    assert isinstance(optimizer, torch.optim.AdamW)
    names = {id(p): name for name, p in module.named_parameters()}
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert set(groups) == {"decay", "no_decay"}
    # MLP: net.0 Linear(2, 16), net.1 LayerNorm(16), net.2 ReLU, net.3 Linear(16, 3)
    assert {names[id(p)] for p in groups["decay"]["params"]} == {"model.net.0.weight", "model.net.3.weight"}
    assert {names[id(p)] for p in groups["no_decay"]["params"]} == {
        "model.net.0.bias",
        "model.net.1.weight",
        "model.net.1.bias",
        "model.net.3.bias",
    }
    assert groups["decay"]["weight_decay"] == 0.05
    assert groups["no_decay"]["weight_decay"] == 0.0
    assert all(g["lr"] == BASE_LR for g in optimizer.param_groups)
    assert trainer.global_step == 1


# --- 6. argument validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda: WarmupCosine(warmup_fraction=1.0), id="warmup_fraction=1"),
        pytest.param(lambda: WarmupCosine(warmup_fraction=1.5), id="warmup_fraction=1.5"),
        pytest.param(lambda: WarmupCosine(warmup_fraction=-0.1), id="warmup_fraction<0"),
        pytest.param(lambda: WarmupCosine(warmup_steps=-1), id="warmup_steps<0"),
        pytest.param(lambda: WarmupCosine(min_lr_ratio=1.5), id="min_lr_ratio>1"),
        pytest.param(lambda: WarmupCosine(min_lr_ratio=-0.1), id="min_lr_ratio<0"),
        pytest.param(lambda: Plateau(factor=1.0), id="plateau-factor=1"),
        pytest.param(lambda: Plateau(factor=2.0), id="plateau-factor=2"),
        pytest.param(lambda: Plateau(factor=0.0), id="plateau-factor=0"),
        pytest.param(lambda: Plateau(patience=-1), id="plateau-patience<0"),
        pytest.param(lambda: OneCycle(pct_start=0.0), id="onecycle-pct_start=0"),
        pytest.param(lambda: OneCycle(pct_start=1.0), id="onecycle-pct_start=1"),
    ],
)
def test_invalid_schedule_arguments_raise_value_error(build):
    with pytest.raises(ValueError, match=r"must be"):
        build()


def test_valid_boundary_schedule_arguments_are_accepted():
    WarmupCosine(warmup_steps=0, warmup_fraction=0.0, min_lr_ratio=0.0)
    WarmupCosine(min_lr_ratio=1.0)
    Plateau(factor=0.999, patience=0)
    OneCycle(pct_start=0.999)


@pytest.mark.parametrize(
    ("schedule", "warmup"),
    [
        pytest.param(WarmupCosine(warmup_steps=10), 10, id="warmup_steps=total"),
        pytest.param(WarmupCosine(warmup_steps=25), 25, id="warmup_steps>total"),
        pytest.param(WarmupCosine(warmup_fraction=0.96), 10, id="warmup_fraction-rounds-to-total"),
    ],
)
def test_warmup_not_shorter_than_the_run_fails_at_configure_time(schedule, warmup):
    recorder = LRRecorder()
    module = make_module(schedule)
    trainer = make_trainer([recorder], max_epochs=2)
    with pytest.raises(ValueError, match=rf"warmup \({warmup} steps\) must be shorter than the run \(10 optimizer"):
        trainer.fit(module, train_dataloaders=make_loader(5))
    assert recorder.step_indices == []
    assert trainer.global_step == 0


def test_fused_where_supported_rebuilds_faithfully_and_keeps_an_explicit_choice():
    import torch

    from lightning_modules.models import MLP
    from lightning_modules.optim.optimizer_kernels import fused_where_supported
    from lightning_modules.optim.parameter_groups import param_groups

    torch.manual_seed(0)
    net = MLP(4, 3)
    opt = torch.optim.AdamW(param_groups(net), lr=0.01, weight_decay=0.1)
    assert fused_where_supported(opt, device_type="cuda") is opt  # CPU parameters, CUDA asked for
    fused = fused_where_supported(opt)  # torch has fused Adam/AdamW kernels for the CPU too
    assert type(fused) is torch.optim.AdamW and fused.defaults["fused"] is True
    assert [(g["name"], g["weight_decay"], g["lr"]) for g in fused.param_groups] == [
        ("decay", 0.1, 0.01),
        ("no_decay", 0.0, 0.01),
    ]
    twin = MLP(4, 3)
    twin.load_state_dict(net.state_dict())
    plain = torch.optim.AdamW(param_groups(twin), lr=0.01, weight_decay=0.1)
    x = torch.randn(8, 4)
    for model, optimizer in ((net, fused), (twin, plain)):
        for _ in range(3):
            optimizer.zero_grad()
            model(x).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(net.parameters(), twin.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    # an explicit choice is kept
    assert fused_where_supported(torch.optim.AdamW(net.parameters(), fused=False), "cpu").defaults["fused"] is False
    assert fused_where_supported(torch.optim.AdamW(net.parameters(), foreach=True), "cpu").defaults["fused"] is None
    rms = torch.optim.RMSprop(net.parameters())
    assert fused_where_supported(rms, "cpu") is rms  # no fused kernel
    integers = torch.optim.SGD([torch.nn.Parameter(torch.ones(2)), torch.zeros(2, dtype=torch.long)], lr=0.1)
    assert fused_where_supported(integers) is integers  # fused kernels take floating-point tensors only


def test_a_one_cycle_warm_up_of_exactly_one_step_fails_at_configure_time_in_one_line():
    """torch's OneCycleLR ends its first phase at ``pct_start * total_steps - 1``: at step 0 when that product is 1,
    and it divides by zero (a ZeroDivisionError from inside torch before this check: `--trainer.limit_train_batches 4`
    on the digits recipe, pct_start 0.25). A warm-up shorter than one step still runs (fast_dev_run)."""
    module = make_module(OneCycle(pct_start=0.1))
    trainer = make_trainer([], max_epochs=2)
    with pytest.raises(ValueError, match=r"pct_start=0.1 of a 10-step run is a warm-up of exactly one optimizer step"):
        trainer.fit(module, train_dataloaders=make_loader(5))
    trainer = make_trainer([], max_epochs=1)
    trainer.fit(make_module(OneCycle(pct_start=0.1)), train_dataloaders=make_loader(5))  # 0.5 steps: no warm-up
    assert trainer.global_step == 5
