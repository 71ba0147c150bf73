"""RegressionModule: losses and metrics on hand-computed cases, target standardization undone in predictions."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import RegressionModule
from lightning_modules.models import MLP


class FixedOutput(nn.Module):
    def __init__(self, values):
        super().__init__()
        self.values = nn.Parameter(torch.as_tensor(values, dtype=torch.float32))

    def forward(self, x):
        return self.values


@pytest.mark.parametrize(
    "loss, expected",
    [
        ("mse", ((1 - 0) ** 2 + (2 - 4) ** 2 + (3 - 3) ** 2) / 3),
        ("l1", (1 + 2 + 0) / 3),
        # huber, delta 1: 0.5 * 1^2, 1 * (2 - 0.5), 0
        ("huber", (0.5 + 1.5 + 0) / 3),
    ],
)
def test_losses_match_hand_computation(loss, expected):
    module = RegressionModule(FixedOutput([[1.0], [2.0], [3.0]]), loss=loss)
    out = module.forward_batch((torch.zeros(3, 1), torch.tensor([0.0, 4.0, 3.0])))
    assert out.loss.item() == pytest.approx(expected)
    assert out.outputs.shape == (3,)


def test_metrics_mae_rmse_r2():
    module = RegressionModule(FixedOutput([[1.0]]))
    preds = torch.tensor([1.0, 2.0, 3.0, 4.0])
    target = torch.tensor([1.5, 2.0, 2.0, 5.0])
    module.val_metrics.update(preds, target)
    values = {k: v.item() for k, v in module.val_metrics.compute().items()}
    assert values["val/mae"] == pytest.approx((0.5 + 0 + 1 + 1) / 4)
    assert values["val/rmse"] == pytest.approx(((0.25 + 0 + 1 + 1) / 4) ** 0.5)
    ss_res = 0.25 + 0 + 1 + 1
    ss_tot = ((target - target.mean()) ** 2).sum().item()
    assert values["val/r2"] == pytest.approx(1 - ss_res / ss_tot)
    assert module.monitor == "val/loss" and module.monitor_mode == "min"


def test_wrong_output_width_is_named():
    module = RegressionModule(MLP(3, 2, [4]), out_features=1)
    with pytest.raises(ValueError, match=r"output shape \(batch, 1\), got \(5, 2\)"):
        module.forward_batch((torch.randn(5, 3), torch.randn(5)))


def test_target_standardization_learns_in_standard_units_and_predicts_in_original_units():
    torch.manual_seed(0)
    x = torch.randn(512, 3)
    y = 1000.0 + 250.0 * (x @ torch.tensor([1.0, -2.0, 0.5]))  # large offset and scale
    loader = DataLoader(TensorDataset(x, y), batch_size=64, shuffle=True)
    val = DataLoader(TensorDataset(x[:128], y[:128]), batch_size=128)
    module = RegressionModule(MLP(3, 1, [32]), standardize_targets=True,
                              optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))
    trainer = L.Trainer(max_epochs=15, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, loader, val)
    assert module.target_mean.item() == pytest.approx(y.mean().item(), rel=1e-5)
    assert module.target_std.item() == pytest.approx(y.std(unbiased=False).item(), rel=1e-4)
    metrics = trainer.validate(module, val, verbose=False)[0]
    assert metrics["val/r2"] > 0.97
    # the loss is in standardized units: about (rmse / std)^2
    assert metrics["val/loss"] == pytest.approx((metrics["val/rmse"] / module.target_std.item()) ** 2, rel=0.05)
    preds = torch.cat(trainer.predict(module, DataLoader(TensorDataset(x[:128]), batch_size=64)))
    assert preds.shape == (128,)
    assert (preds - y[:128]).abs().mean().item() == pytest.approx(metrics["val/mae"], rel=1e-3)
    # statistics travel with the checkpoint and are not refitted on resume
    state = module.state_dict()
    assert state["target_stats_fitted"].item() is True and "target_mean" in state


def test_multi_output_targets():
    module = RegressionModule(FixedOutput([[1.0, 2.0], [3.0, 4.0]]), out_features=2)
    out = module.forward_batch((torch.zeros(2, 1), torch.tensor([[1.0, 2.0], [3.0, 5.0]])))
    assert out.loss.item() == pytest.approx(F.mse_loss(torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
                                                        torch.tensor([[1.0, 2.0], [3.0, 5.0]])).item())


@pytest.mark.parametrize("kwargs, match", [({"out_features": 0}, "out_features"), ({"loss": "log"}, "loss must be"),
                                           ({"huber_delta": 0.0}, "huber_delta")])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RegressionModule(MLP(2, 1), **kwargs)
