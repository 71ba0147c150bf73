"""Early stopping says why it stopped: one stderr line and the run tag (recipes/callbacks/early_stopping.py)."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from recipes.cli import main
from recipes.callbacks.early_stopping import TAG, RecipeEarlyStopping
from tests.conftest import SPIRAL, mlflow_client, runs_of


class ScriptedValLoss(L.LightningModule):
    """A task whose ``val/loss`` of epoch e (from 1) is ``values[e - 1]``; training changes nothing."""

    def __init__(self, values: list[float]) -> None:
        super().__init__()
        self.values = values
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum() * 0.0

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.values[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(2, 1)), batch_size=2)


def fit(values, max_epochs=20, ckpt_path=None, **trainer_kwargs) -> tuple[L.Trainer, RecipeEarlyStopping]:
    stopping = RecipeEarlyStopping(monitor="val/loss", mode="min", patience=3)
    trainer = L.Trainer(
        max_epochs=max_epochs,
        callbacks=[stopping],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **trainer_kwargs,
    )
    trainer.fit(ScriptedValLoss(values), ckpt_path=ckpt_path)
    return trainer, stopping


VALUES = [3.0, 2.0, 0.25, 1.5, 1.6, 1.7, 0.1, 0.1, 0.1, 0.1]
EXPECTED = "early stopping at epoch 6: val/loss has not improved for 3 validations (best 0.25 at epoch 3, patience 3)"


def early_stopping_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "early stopping" in line]


def test_the_line_names_metric_best_value_its_epoch_and_patience(capsys):
    trainer, stopping = fit(VALUES)
    assert trainer.current_epoch == 6  # Lightning stopped it after epoch 6 (from 1), as before
    assert early_stopping_lines(capsys.readouterr().err) == [f"recipes: {EXPECTED}"]
    assert stopping.reason == EXPECTED and stopping.best_epoch == 3


def test_no_line_when_the_run_reaches_max_epochs(capsys):
    _, stopping = fit(VALUES[:5], max_epochs=5)
    assert early_stopping_lines(capsys.readouterr().err) == []
    assert stopping.reason is None and stopping.best_epoch == 3


def test_min_epochs_holds_the_stop_back_and_the_line_says_where_it_happened(capsys):
    fit(VALUES[:6] + [1.8, 1.9], min_epochs=8)
    assert early_stopping_lines(capsys.readouterr().err) == [
        "recipes: early stopping at epoch 8: val/loss has not improved for 5 validations (best 0.25 at epoch 3, "
        "patience 3)"
    ]


def test_a_resumed_run_names_the_epoch_of_the_best_value_before_the_interruption(tmp_path, capsys):
    trainer, _ = fit(VALUES, max_epochs=4)
    trainer.save_checkpoint(tmp_path / "epoch4.ckpt")
    assert early_stopping_lines(capsys.readouterr().err) == []
    _, resumed = fit(VALUES, ckpt_path=str(tmp_path / "epoch4.ckpt"))
    assert early_stopping_lines(capsys.readouterr().err) == [f"recipes: {EXPECTED}"]
    assert resumed.best_epoch == 3


def test_state_round_trips_and_old_state_loads():
    stopping = RecipeEarlyStopping(monitor="val/loss", patience=3)
    stopping.best_epoch = 7
    state = stopping.state_dict()
    assert state["best_epoch"] == 7 and "wait_count" in state
    fresh = RecipeEarlyStopping(monitor="val/loss", patience=3)
    fresh.load_state_dict(state)
    assert fresh.best_epoch == 7
    state.pop("best_epoch")  # a checkpoint of Lightning's own EarlyStopping
    fresh.load_state_dict(state)
    assert fresh.best_epoch is None


@pytest.mark.usefixtures("one_thread")
def test_the_recipe_prints_one_line_and_tags_the_run(workdir, capsys):
    # lr 0: val/acc never improves after the first epoch, so patience 2 stops after 3 epochs of 40
    lr_zero = ["--model.init_args.optimizer.init_args.lr", "0.0"]
    main(["fit", "-c", str(SPIRAL), "--early_stopping_patience", "2", *lr_zero])
    run = runs_of(workdir, "spiral_mlp")[0]
    first = mlflow_client(workdir).get_metric_history(run.info.run_id, "val/acc")[0].value
    reason = (
        f"early stopping at epoch 3: val/acc has not improved for 2 validations (best {first:.4g} at epoch 1, "
        "patience 2)"
    )
    assert early_stopping_lines(capsys.readouterr().err) == [f"recipes: {reason}"]
    assert run.data.tags[TAG] == reason
