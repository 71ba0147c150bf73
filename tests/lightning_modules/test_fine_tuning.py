"""Fine-tuning on every task with a plain Lightning Trainer: init_from, freeze/unfreeze, learning rates per part."""

from __future__ import annotations

import math
import pickle

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from safetensors.torch import save_file
from torch import nn

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule, LanguageModelModule
from lightning_modules.fine_tuning.initial_weights import InitialWeights
from lightning_modules.models import GPT, MLP
from lightning_modules.optim.schedules import OneCycle, WarmupCosine

pytestmark = pytest.mark.usefixtures("one_thread")


def mlp(hidden=(16, 16), norm=None) -> MLP:
    return MLP(2, 3, list(hidden), norm=norm)


def trainer(tmp_path, epochs=1, **kwargs) -> L.Trainer:
    options = dict(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, default_root_dir=tmp_path)
    return L.Trainer(**{**options, **kwargs})


@pytest.fixture(scope="module")
def spiral() -> SpiralDataModule:
    return SpiralDataModule(n_samples=400, batch_size=50, seed=0)


@pytest.fixture
def pretrained(tmp_path):
    """A trained-looking MLP and its weights saved as .pt, .safetensors and a loopwise task checkpoint."""
    torch.manual_seed(1)
    source = mlp()
    state = source.state_dict()
    torch.save(state, tmp_path / "net.pt")
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "net.safetensors"))
    task_state = {f"model.{k}": v for k, v in state.items()}
    task_state["class_weights"] = torch.ones(3)  # a task buffer outside the network
    torch.save({"state_dict": task_state, "pytorch-lightning_version": "2.6.0"}, tmp_path / "task.ckpt")
    return source, tmp_path


@pytest.mark.parametrize("name", ["net.pt", "net.safetensors", "task.ckpt"])
def test_init_from_loads_each_file_format_and_reports_it(pretrained, name):
    source, folder = pretrained
    task = ClassificationModule(mlp(), num_classes=3, init_from=str(folder / name))
    assert not torch.equal(task.model.net[0].weight, source.net[0].weight)
    report = task.load_initial_weights()
    for key, value in source.state_dict().items():
        assert torch.equal(task.model.state_dict()[key], value), key
    assert len(report.loaded) == 6 and report.loaded_parameters == 2 * 16 + 16 + 16 * 16 + 16 + 16 * 3 + 3
    assert report.complete and report.missing == report.unexpected == []
    assert task.load_initial_weights() is report  # once: a second call loads nothing again
    assert task.expected_initial_loss() is None  # pretrained: the doctor does not expect ln(C)


class Wrapped(nn.Module):
    """A network with a pretrained part (backbone) and a new head."""

    def __init__(self, classes: int = 5) -> None:
        super().__init__()
        self.backbone = mlp()
        self.head = nn.Linear(3, classes)

    def forward(self, x):
        return self.head(self.backbone(x))


def test_key_mapping_into_a_submodule_with_a_prefix_or_leaving_parts_out(pretrained):
    source, folder = pretrained
    into = ClassificationModule(Wrapped(), num_classes=5, init_from=InitialWeights(str(folder / "net.pt"), into="backbone"))
    assert into.load_initial_weights().target == "network.backbone"
    assert torch.equal(into.model.backbone.net[0].weight, source.net[0].weight)

    with pytest.raises(ValueError, match=r"2 missing: head.weight, head.bias.*init_from.exclude"):
        ClassificationModule(Wrapped(), num_classes=5,
                             init_from=InitialWeights(str(folder / "net.pt"), add_prefix="backbone.")).load_initial_weights()
    prefixed = ClassificationModule(
        Wrapped(), num_classes=5, init_from=InitialWeights(str(folder / "net.pt"), add_prefix="backbone.", exclude=["head"])
    )
    assert len(prefixed.load_initial_weights().loaded) == 6

    # a Lightning checkpoint of someone else's module keeps its network under another attribute
    torch.save({"state_dict": {f"encoder.{k}": v for k, v in source.state_dict().items()}}, folder / "other.ckpt")
    stripped = ClassificationModule(mlp(), num_classes=3,
                                    init_from=InitialWeights(str(folder / "other.ckpt"), strip_prefix="encoder."))
    assert stripped.load_initial_weights().complete


def test_a_mismatch_names_keys_and_shapes_and_non_strict_loads_what_matches(pretrained):
    source, folder = pretrained
    wider = ClassificationModule(mlp(hidden=(16, 8)), num_classes=3, init_from=str(folder / "net.pt"))
    before = {k: v.clone() for k, v in wider.model.state_dict().items()}
    with pytest.raises(ValueError) as err:
        wider.load_initial_weights()
    message = str(err.value)
    assert "net.2.weight file (16, 16) vs network (8, 16)" in message and "init_from.strict: false" in message
    assert all(torch.equal(wider.model.state_dict()[k], v) for k, v in before.items())  # nothing loaded
    loose = ClassificationModule(mlp(hidden=(16, 8)), num_classes=3,
                                 init_from=InitialWeights(str(folder / "net.pt"), strict=False))
    report = loose.load_initial_weights()
    assert report.loaded == ["net.0.weight", "net.0.bias", "net.4.bias"]  # the output bias keeps its shape
    assert [key for key, _, _ in report.mismatched] == ["net.2.weight", "net.2.bias", "net.4.weight"]
    assert torch.equal(loose.model.net[0].weight, source.net[0].weight)


def test_bad_weight_files_are_one_line_each(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with open(tmp_path / "code.pt", "wb") as f:
        pickle.dump(Wrapped, f)  # a pickle that would import code: refused by weights_only
    cases = {
        "missing.pt": "init_from: no file",
        "notes.txt": "has suffix '.txt'; expected one of .ckpt, .pt",
        "code.pt": "cannot be read weights-only",
    }
    for name, expected in cases.items():
        with pytest.raises((ValueError, FileNotFoundError)) as err:
            ClassificationModule(mlp(), num_classes=3, init_from=str(tmp_path / name)).load_initial_weights()
        assert expected in str(err.value) and "\n" not in str(err.value), name


def test_a_fine_tuned_checkpoint_reloads_and_resumes_without_the_initial_file(pretrained, spiral, tmp_path):
    source, folder = pretrained
    task = ClassificationModule(mlp(), num_classes=3, init_from=str(folder / "net.pt"))
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True)
    fit = trainer(tmp_path, epochs=1, enable_checkpointing=True, callbacks=[checkpoint])
    fit.fit(task, spiral)
    assert task.weights_report is not None and task.weights_report.complete
    (folder / "net.pt").unlink()  # handed to someone without the original file
    loaded = ClassificationModule.load_from_checkpoint(checkpoint.last_model_path, model=mlp())
    x = torch.randn(7, 2)
    assert torch.equal(loaded.eval()(x), task.eval()(x))
    trainer(tmp_path).validate(loaded, spiral, verbose=False)  # setup does not look for the initial file
    assert torch.equal(loaded.eval()(x), task.eval()(x))
    resumed = ClassificationModule(mlp(), num_classes=3, init_from=str(folder / "net.pt"))
    trainer(tmp_path, epochs=2).fit(resumed, spiral, ckpt_path=checkpoint.last_model_path)
    assert resumed.weights_report is None  # the checkpoint's weights, the missing file never read


class Observe(Callback):
    """Per training batch: the LR of each named group, the norm layer's mode, the frozen layer's weights."""

    def __init__(self) -> None:
        self.lrs: list[dict[str, float]] = []
        self.norm_training: list[bool] = []
        self.norm_stats: list[torch.Tensor] = []
        self.first_weights: list[torch.Tensor] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append({g["name"]: g["lr"] for g in trainer.optimizers[0].param_groups})
        self.norm_training.append(pl_module.model.net[1].training)
        self.norm_stats.append(pl_module.model.net[1].running_mean.clone())
        self.first_weights.append(pl_module.model.net[0].weight.detach().clone())


def test_frozen_until_its_epoch_with_norms_in_eval_and_every_group_on_the_schedule(spiral, tmp_path):
    torch.manual_seed(0)
    task = ClassificationModule(
        mlp(norm="batch"), num_classes=3, freeze=["net.0", "net.1"], unfreeze_at_epoch=2,
        lr_multipliers={"net.0": 0.1}, schedule=WarmupCosine(warmup_steps=3),
        optimizer=lambda params: torch.optim.AdamW(params, lr=0.01),
    )
    assert task.fine_tuning.phases() == [(0, 355, 80), (2, 435, 0)]  # net.0: 2*16+16, net.1 (batch norm): 16+16
    observe = Observe()
    fit = trainer(tmp_path, epochs=3, callbacks=[observe])
    fit.fit(task, spiral)
    per_epoch = fit.num_training_batches
    frozen, unfrozen = slice(0, 2 * per_epoch), slice(2 * per_epoch + 1, None)
    assert all(torch.equal(w, observe.first_weights[0]) for w in observe.first_weights[frozen])
    assert not torch.equal(observe.first_weights[-1], observe.first_weights[0])
    assert observe.norm_training[frozen] == [False] * (2 * per_epoch)  # frozen batch norm: pretrained statistics
    assert all(torch.equal(s, observe.norm_stats[0]) for s in observe.norm_stats[frozen])
    assert all(observe.norm_training[unfrozen])
    # the frozen part was in the optimizer's groups from the start: the schedule moved its LR on every step, at 0.1x
    total = fit.estimated_stepping_batches
    for step, lrs in enumerate(observe.lrs):
        factor = WarmupCosine(warmup_steps=3).build(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0), total,
                                                     "", "min")["scheduler"].lr_lambdas[0](step)
        assert lrs["decay"] == pytest.approx(0.01 * factor)
        assert lrs["net.0/decay"] == pytest.approx(0.001 * factor)
    assert set(observe.lrs[0]) == {"decay", "no_decay", "net.0/decay", "net.0/no_decay"}


def test_gradual_unfreezing_per_pattern_and_phases():
    task = ClassificationModule(mlp(), num_classes=3, freeze=["net.0", "net.2"], unfreeze_at_epoch={"net.2": 1})
    assert task.fine_tuning.phases() == [(0, 51, 320), (1, 323, 48)]  # net.0 stays frozen: never unfrozen
    schedule = task.fine_tuning.freeze_schedule
    schedule.apply(None)
    assert [p.requires_grad for p in task.model.parameters()] == [False, False, False, False, True, True]
    schedule.apply(1)
    assert [p.requires_grad for p in task.model.parameters()] == [False, False, True, True, True, True]


def test_fine_tuning_arguments_that_name_nothing_are_errors():
    cases = [
        (dict(freeze=["backbone"]), "freeze: 'backbone' matches no module of MLP (its parts: ['net'])"),
        (dict(lr_multipliers={"head": 0.1}), "lr_multipliers: 'head' matches no parameter of MLP"),
        (dict(unfreeze_at_epoch=2), "unfreeze_at_epoch needs freeze"),
        (dict(freeze=["net.0"], unfreeze_at_epoch={"net.2": 1}), "['net.2'] are not among the freeze patterns"),
        (dict(freeze=["net.0"], unfreeze_at_epoch=0), "at an epoch >= 1"),
        (dict(layerwise_lr_decay=0.8), "MLP has no stack of blocks"),
        (dict(layerwise_lr_decay=1.5), "layerwise_lr_decay must be in (0, 1]"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(ValueError) as err:
            ClassificationModule(mlp(), num_classes=3, **kwargs)
        assert expected in str(err.value), kwargs


def test_layerwise_decay_over_gpt_blocks_composes_with_multipliers():
    torch.manual_seed(0)
    task = LanguageModelModule(
        GPT(vocab_size=11, block_size=8, d_model=16, n_layers=3, n_heads=2), vocab_size=11,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1.0), layerwise_lr_decay=0.5,
        lr_multipliers={"tok_emb": 0.1},
    )
    lrs = {g["name"]: g["lr"] for g in task.configure_optimizers().param_groups}
    assert lrs["layer1/decay"] == 0.5 ** 3 and lrs["layer2/decay"] == 0.25 and lrs["layer3/decay"] == 0.5
    assert lrs["layer0/decay"] == 0.5 ** 4  # pos_emb: below the stack
    assert lrs["tok_emb/layer0/decay"] == pytest.approx(0.1 * 0.5 ** 4)  # the head shares tok_emb's weight
    assert lrs["no_decay"] == 1.0  # the final norm: above the stack


def test_one_cycle_with_its_own_max_lr_keeps_the_multipliers(spiral, tmp_path):
    task = ClassificationModule(mlp(), num_classes=3, lr_multipliers={"net.0": 0.1}, schedule=OneCycle(max_lr=0.02))
    fit = trainer(tmp_path, epochs=1, max_steps=2)
    fit.fit(task, spiral)
    groups = {g["name"]: g for g in fit.optimizers[0].param_groups}
    assert groups["net.0/decay"]["max_lr"] == pytest.approx(0.002) and groups["decay"]["max_lr"] == 0.02
    assert groups["net.0/decay"]["lr"] / groups["decay"]["lr"] == pytest.approx(0.1)
    assert math.isclose(groups["net.0/no_decay"]["initial_lr"], 0.002 / 25)


def test_unfreezing_on_schedule_is_refused_with_several_processes():
    from types import SimpleNamespace

    task = ClassificationModule(mlp(), num_classes=3, freeze=["net.0"], unfreeze_at_epoch=1)
    with pytest.raises(ValueError, match="DDP synchronizes only the parameters that are trainable"):
        task.fine_tuning.freeze_schedule.setup(SimpleNamespace(world_size=2, strategy=None), task, "fit")
    frozen_for_good = ClassificationModule(mlp(), num_classes=3, freeze=["net.0"])
    frozen_for_good.fine_tuning.freeze_schedule.setup(SimpleNamespace(world_size=2, strategy=None), frozen_for_good, "fit")
    assert not frozen_for_good.model.net[0].weight.requires_grad


def test_a_network_that_starts_trained_has_no_expected_first_loss(pretrained):
    source, folder = pretrained
    gpt = GPT(vocab_size=11, block_size=8, d_model=16, n_layers=1, n_heads=2)
    assert LanguageModelModule(gpt, vocab_size=11).expected_initial_loss() == pytest.approx(math.log(11))
    torch.save(gpt.state_dict(), folder / "gpt.pt")
    started = LanguageModelModule(GPT(vocab_size=11, block_size=8, d_model=16, n_layers=1, n_heads=2), vocab_size=11,
                                  init_from=str(folder / "gpt.pt"))
    assert started.expected_initial_loss() is None

    class Pretrained(MLP):
        pretrained = True  # what the Hugging Face networks declare

    assert ClassificationModule(Pretrained(2, 3, [4]), num_classes=3).expected_initial_loss() is None
