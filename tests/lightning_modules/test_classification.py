"""ClassificationModule: loss, metrics, checks against the data and the network, checkpoints in plain Lightning."""

import math

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP


def quiet_trainer(**kwargs):
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return L.Trainer(**{**defaults, **kwargs})


class FixedLogits(nn.Module):
    """Returns preset logits, whatever the input."""

    def __init__(self, logits):
        super().__init__()
        self.logits = nn.Parameter(torch.as_tensor(logits, dtype=torch.float32))

    def forward(self, x):
        return self.logits


def test_multiclass_loss_matches_hand_computed_cross_entropy():
    logits = [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    module = ClassificationModule(FixedLogits(logits), num_classes=3)
    out = module.forward_batch((torch.zeros(2, 1), torch.tensor([0, 2])))
    l0 = -math.log(math.exp(2) / (math.exp(2) + 2))
    l1 = -math.log(1 / (math.e + 2))
    assert out.loss.item() == pytest.approx((l0 + l1) / 2, rel=1e-6)
    assert out.batch_size == 2


def test_label_smoothing_and_class_weights_match_torch():
    torch.manual_seed(0)
    logits = torch.randn(6, 3)
    y = torch.tensor([0, 1, 2, 2, 1, 0])
    w = [1.0, 2.0, 0.5]
    module = ClassificationModule(FixedLogits(logits), num_classes=3, label_smoothing=0.1, class_weights=w)
    expected = F.cross_entropy(logits, y, weight=torch.tensor(w), label_smoothing=0.1)
    assert module.forward_batch((torch.zeros(6, 1), y)).loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_binary_task_uses_one_logit_bce_and_pos_weight():
    logits = torch.tensor([[0.5], [-1.0], [2.0]])
    y = torch.tensor([1, 0, 1])
    module = ClassificationModule(FixedLogits(logits), num_classes=2, task="binary", class_weights=[1.0, 3.0])
    expected = F.binary_cross_entropy_with_logits(logits.squeeze(1), y.float(), pos_weight=torch.tensor([3.0]))
    assert module.forward_batch((torch.zeros(3, 1), y)).loss.item() == pytest.approx(expected.item(), rel=1e-6)
    smooth = ClassificationModule(FixedLogits(logits), num_classes=2, task="binary", label_smoothing=0.2)
    target = y.float() * 0.8 + 0.1
    expected = F.binary_cross_entropy_with_logits(logits.squeeze(1), target)
    assert smooth.forward_batch((torch.zeros(3, 1), y)).loss.item() == pytest.approx(expected.item(), rel=1e-6)
    probs = smooth.predict_step((torch.zeros(3, 1),), 0)
    assert torch.allclose(probs, torch.sigmoid(logits.squeeze(1)))


def test_metrics_per_stage_are_separate_and_named():
    module = ClassificationModule(FixedLogits([[3.0, 0.0], [3.0, 0.0], [0.0, 3.0], [0.0, 3.0]]), num_classes=2)
    module.val_metrics.update(torch.tensor([[3.0, 0.0], [3.0, 0.0], [0.0, 3.0], [0.0, 3.0]]), torch.tensor([0, 1, 1, 1]))
    values = {k: v.item() for k, v in module.val_metrics.compute().items()}
    assert values["val/acc"] == pytest.approx(0.75)
    # macro F1: class 0 P=1/2 R=1 -> 2/3; class 1 P=1 R=2/3 -> 0.8
    assert values["val/f1"] == pytest.approx((2 / 3 + 0.8) / 2, rel=1e-5)
    assert module.train_metrics["acc"] is not module.val_metrics["acc"]
    assert module.monitor == "val/acc" and module.monitor_mode == "max"


def test_wrong_network_width_is_named():
    module = ClassificationModule(MLP(2, 4, [8]), num_classes=3)
    with pytest.raises(ValueError, match=r"expects the network to output shape \(batch, 3\), got \(5, 4\)"):
        module.forward_batch((torch.randn(5, 2), torch.zeros(5).long()))


def test_num_classes_is_checked_against_the_data_at_setup():
    module = ClassificationModule(MLP(2, 4, [8]), num_classes=4)
    dm = SpiralDataModule(n_samples=200, n_classes=3)
    with pytest.raises(ValueError, match="SpiralDataModule has 3 classes but ClassificationModule has num_classes=4"):
        quiet_trainer(max_epochs=1).fit(module, dm)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"num_classes": 1}, "num_classes must be >= 2"),
        ({"num_classes": 3, "task": "binary"}, "needs num_classes=2"),
        ({"num_classes": 3, "label_smoothing": 1.0}, "label_smoothing"),
        ({"num_classes": 3, "class_weights": [1.0, 2.0]}, "2 values for 3 classes"),
        ({"num_classes": 2, "class_weights": [1.0, 0.0]}, "must be > 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ClassificationModule(MLP(2, 3), **kwargs)


def test_plain_trainer_learns_the_spiral_and_checkpoint_round_trips(tmp_path):
    L.seed_everything(0)
    dm = SpiralDataModule(n_samples=600, batch_size=32)
    module = ClassificationModule(MLP(2, 3, [32, 32]), num_classes=3,
                                  optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer = quiet_trainer(max_epochs=15, deterministic=True)
    trainer.fit(module, dm)
    acc = trainer.validate(module, dm, verbose=False)[0]["val/acc"]
    assert acc >= 0.9
    path = tmp_path / "plain.ckpt"
    trainer.save_checkpoint(path)
    # a module built in Python keeps plain hyperparameters; the network is passed again when loading
    assert set(module.hparams) == {"num_classes", "task", "label_smoothing", "class_weights", "monitor", "monitor_mode", "compile",
                                   "channels_last", "init_from", "freeze", "unfreeze_at_epoch", "lr_multipliers",
                                   "layerwise_lr_decay"}
    loaded = ClassificationModule.load_from_checkpoint(path, model=MLP(2, 3, [32, 32]))
    x = dm.datasets["val"].tensors[0]
    module.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.equal(module(x), loaded(x))


def test_auto_class_weights_are_inverse_frequency_from_the_data():
    from lightning_modules.classification import inverse_frequency_weights

    assert inverse_frequency_weights([900, 100]) == pytest.approx([1000 / 1800, 1000 / 200])
    dm = SpiralDataModule(n_samples=300, n_classes=3, val_fraction=0.2, test_fraction=0.0)
    module = ClassificationModule(MLP(2, 3, [8]), num_classes=3, class_weights="auto")
    quiet_trainer(max_steps=1, limit_val_batches=0).fit(module, dm)
    counts = dm.class_counts
    expected = [sum(counts) / (3 * c) for c in counts]
    assert module.class_weights.tolist() == pytest.approx(expected)
    # the weights are part of the checkpoint state
    assert torch.equal(module.state_dict()["class_weights"], module.class_weights)
    with pytest.raises(ValueError, match="have no training samples"):
        inverse_frequency_weights([5, 0, 3])
    with pytest.raises(ValueError, match="'auto' is for multiclass and binary"):
        ClassificationModule(MLP(2, 3), num_classes=3, task="multilabel", class_weights="auto")


def test_multilabel_loss_metrics_and_shape_check():
    logits = torch.tensor([[2.0, -1.0, 0.5], [-3.0, 1.0, 0.0]])
    targets = torch.tensor([[1, 0, 1], [0, 1, 0]])
    module = ClassificationModule(FixedLogits(logits), num_classes=3, task="multilabel", class_weights=[1.0, 2.0, 3.0])
    out = module.forward_batch((torch.zeros(2, 1), targets))
    expected = F.binary_cross_entropy_with_logits(logits, targets.float(), pos_weight=torch.tensor([1.0, 2.0, 3.0]))
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    module.val_metrics.update(*module.metric_inputs(out))
    # thresholded at 0.5: predictions [[1,0,1],[0,1,0]] (sigmoid(0)=0.5 counts as negative) -> all correct
    assert module.val_metrics.compute()["val/acc"].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"targets of shape \(2, 3\)"):
        module.forward_batch((torch.zeros(2, 1), torch.tensor([0, 1])))
    probs = module.predict_step((torch.zeros(2, 1),), 0)
    assert torch.allclose(probs, torch.sigmoid(logits))


def test_auroc_and_confusion_matrix_on_validation():
    # 4 samples, 2 classes; scores rank both positives above both negatives except one swap
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.5, 0.0], [0.0, 3.0]])
    labels = torch.tensor([0, 1, 1, 1])
    module = ClassificationModule(FixedLogits(logits), num_classes=2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1), labels), batch_size=4)
    metrics = quiet_trainer().validate(module, loader, verbose=False)[0]
    assert metrics["val/acc"] == pytest.approx(0.75)
    # multiclass macro AUROC with 2 classes: class 1 scores p1 = softmax -> ranks: negatives {s0}, positives
    # {s1, s2, s3}; p1(s0) is the lowest, so AUROC = 1 for both one-vs-rest curves
    assert metrics["val/auroc"] == pytest.approx(1.0)
    assert module.last_confusion_matrix["val"].tolist() == [[1, 0], [1, 2]]
    assert "train/auroc" not in {f"train/{k}" for k in module.train_metrics.keys(keep_base=True)}


def test_binary_auroc_by_hand():
    logits = torch.tensor([[0.9], [0.2], [0.4], [-1.0]])
    labels = torch.tensor([1, 1, 0, 0])
    module = ClassificationModule(FixedLogits(logits), num_classes=2, task="binary")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1), labels), batch_size=4)
    metrics = quiet_trainer().validate(module, loader, verbose=False)[0]
    # pairs (pos, neg): (0.9,0.4) ok, (0.9,-1) ok, (0.2,0.4) wrong, (0.2,-1) ok -> 3/4
    assert metrics["val/auroc"] == pytest.approx(0.75)
    # sigmoid > 0.5 for logits 0.9, 0.2, 0.4: true 0 -> one right, one wrong; true 1 -> both right
    assert module.last_confusion_matrix["val"].tolist() == [[1, 1], [0, 2]]


@pytest.mark.slow
def test_compiled_and_plain_checkpoints_load_into_each_other(tmp_path):
    import platform
    import shutil

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("torch.compile's inductor backend needs a C compiler on CPU; none is installed")
    L.seed_everything(0)
    dm = SpiralDataModule(n_samples=300, batch_size=64)
    compiled = ClassificationModule(MLP(2, 3, [16]), num_classes=3, compile=True)
    trainer = quiet_trainer(max_epochs=2)
    trainer.fit(compiled, dm)
    assert getattr(compiled.model, "_compiled_call_impl", None) is not None, platform.platform()
    path = tmp_path / "compiled.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=True)["state_dict"]
    assert not any("_orig_mod" in k for k in state)
    plain = ClassificationModule.load_from_checkpoint(path, model=MLP(2, 3, [16]), compile=False)
    x = dm.datasets["val"].tensors[0]
    compiled.eval(), plain.eval()
    with torch.no_grad():
        assert torch.allclose(compiled(x), plain(x), atol=1e-5)
    # and the other way: a plain checkpoint into a compiled module
    plain_path = tmp_path / "plain.ckpt"
    trainer2 = quiet_trainer(max_epochs=1)
    trainer2.fit(plain, dm)
    trainer2.save_checkpoint(plain_path)
    recompiled = ClassificationModule.load_from_checkpoint(plain_path, model=MLP(2, 3, [16]), compile=True)
    recompiled.setup("validate")
    recompiled.eval(), plain.eval()
    with torch.no_grad():
        assert torch.allclose(recompiled(x), plain(x), atol=1e-5)


def test_channels_last_formats_weights_and_image_batches_with_the_same_outputs():
    from lightning_modules.models import ConvNet
    from lightning_modules.batches import to_channels_last

    torch.manual_seed(0)
    plain = ClassificationModule(ConvNet(1, 10, widths=[4, 8]), num_classes=10)
    fast = ClassificationModule(ConvNet(1, 10, widths=[4, 8]), num_classes=10, channels_last=True)
    fast.model.load_state_dict(plain.model.state_dict())
    fast.setup("fit")
    conv = fast.model.stages[0][0].conv1.weight  # (4, 4, 3, 3): the stem's single input channel is both formats
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    x = torch.randn(6, 1, 8, 8)
    seen = []
    fast.model.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    plain.eval(), fast.eval()
    with torch.no_grad():
        assert torch.allclose(plain.run_model(x), fast.run_model(x), atol=1e-5)
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and torch.equal(seen[0], x)
    batch = to_channels_last({"images": x, "ids": torch.arange(6), "pair": (x, x.flatten(1))})
    assert batch["images"].is_contiguous(memory_format=torch.channels_last)
    assert batch["ids"].is_contiguous() and batch["pair"][1].is_contiguous()
    assert fast.hparams["channels_last"] is True


def _fit_spiral_recording_log_dict_calls(module_cls: type, epochs: int) -> tuple[list, list[dict[str, float]]]:
    """Fit ``module_cls`` on spiral data for ``epochs``: (the metric collections handed to Lightning by ``log_dict``;
    the epoch-end ``callback_metrics`` of every train epoch)."""
    per_epoch: list[dict[str, float]] = []

    class Spy(L.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            per_epoch.append({k: float(v) for k, v in trainer.callback_metrics.items()})

    L.seed_everything(0)
    dm = SpiralDataModule(n_samples=300, batch_size=32)  # 7 train and 2 val batches per epoch
    module = module_cls(MLP(2, 3, [32]), num_classes=3, optimizer=lambda p: torch.optim.AdamW(p, lr=0.05))
    calls: list = []
    original = module.log_dict
    module.log_dict = lambda *a, **k: (calls.append(a[0]), original(*a, **k))[1]
    quiet_trainer(max_epochs=epochs, callbacks=[Spy()], num_sanity_val_steps=0).fit(module, dm)
    return calls, per_epoch


def test_metrics_are_logged_once_per_epoch_and_reach_callbacks_at_epoch_end():
    """The metric objects go to self.log once per epoch (Lightning's per-call cost), yet the epoch values are there
    for every callback's on_train_epoch_end, as when they were logged every step."""
    calls, seen = _fit_spiral_recording_log_dict_calls(ClassificationModule, epochs=2)
    assert len(calls) == 4  # train and val, once per epoch each
    assert [list(c.keys()) for c in calls[2:]] == [["train/acc", "train/f1"], ["val/acc", "val/f1", "val/auroc"]]
    assert len(seen) == 2 and all({"train/acc", "train/f1", "val/acc", "val/f1", "val/auroc"} <= set(s) for s in seen)
    assert seen[0]["train/acc"] != seen[1]["train/acc"]  # computed per epoch, reset in between


def test_epoch_metrics_survive_a_subclass_that_overrides_epoch_start_hooks_without_super():
    """A user's subclass that overrides the epoch-start hooks and forgets super() still gets its epoch metrics every
    epoch: the first batch of each epoch (batch_idx 0) hands the metric objects to self.log by itself."""

    class Forgetful(ClassificationModule):
        def on_train_epoch_start(self) -> None:
            pass

        def on_validation_epoch_start(self) -> None:
            pass

    calls, per_epoch = _fit_spiral_recording_log_dict_calls(Forgetful, epochs=3)
    assert len(calls) == 6  # train and val, once in each of the 3 epochs
    assert len(per_epoch) == 3
    assert all({"train/acc", "val/acc", "val/auroc"} <= set(m) for m in per_epoch)
    assert len({m["train/acc"] for m in per_epoch}) == 3 and len({m["val/acc"] for m in per_epoch}) >= 2


def test_bf16_mixed_clips_a_fused_adamw(tmp_path):
    """Lightning's mixed-precision plugin refuses to clip for an optimizer that unscales gradients itself (a fused
    AdamW, which the task builds on CUDA) even with bf16, which has no GradScaler: every GPU recipe (bf16, fused AdamW,
    gradient_clip_val 1.0) stopped at its first step. The task clips the default way itself and keeps the norm."""
    import functools

    L.seed_everything(0)
    x, y = torch.randn(64, 2), torch.randint(0, 3, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    module = ClassificationModule(MLP(2, 3, [8]), 3, optimizer=functools.partial(torch.optim.AdamW, lr=0.01, fused=True))
    trainer = L.Trainer(max_epochs=1, precision="bf16-mixed", gradient_clip_val=1.0, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(module, loader)
    assert trainer.global_step == 4 and module.gradient_norm is not None and torch.isfinite(module.gradient_norm)
