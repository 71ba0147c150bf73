"""The recipe contract (issue 29, item 3): a user's own task and data module, plain ``LightningModule`` and
``LightningDataModule`` subclasses that implement none or only part of ``lightning_modules.recipe_contract`` and
``datamodules.recipe_contract``, run through ``recipes fit`` and ``recipes predict`` with the documented defaults."""

from __future__ import annotations

import math
from pathlib import Path

import lightning.pytorch as pl
import pandas as pd
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import datamodules.recipe_contract as data_contract
import lightning_modules.recipe_contract as task_contract
from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from recipes.cli import main
from recipes.predict.predictions import prediction_table
from recipes.tracking.config import DEFAULT_EXPERIMENT
from tests.conftest import runs_of

SAMPLES = 96


def two_blobs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two separable classes in two dimensions."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(SAMPLES) % 2
    points = torch.randn(SAMPLES, 2, generator=generator) * 0.3 + labels[:, None].float() * 2 - 1
    return points, labels


class TinyNet(nn.Module):
    """A user's network."""

    def __init__(self, hidden: int = 8) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class PlainTask(pl.LightningModule):
    """A user's task that implements nothing of the contract (its network, a recipe's ``model.init_args.model``,
    is the ``model`` member of the contract under another name: ``net``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.net = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.log("val/loss", nn.functional.cross_entropy(logits, y))
        self.log("val/acc", (logits.argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class PartialTask(PlainTask):
    """A user's task with part of the contract: the monitored metric, readable columns, an expected first loss, its
    network as ``model``."""

    monitor = "val/acc"
    monitor_mode = "max"
    default_monitor = "val/acc"

    @property
    def model(self) -> nn.Module:
        return self.net

    def prediction_columns(self, outputs: torch.Tensor, datamodule=None) -> dict[str, list]:
        return {"prediction": ["left" if i == 0 else "right" for i in outputs.argmax(1).tolist()]}

    def expected_initial_loss(self) -> float:
        return math.log(2)


class PlainData(pl.LightningDataModule):
    """A user's data module that implements nothing of the contract."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed

    def setup(self, stage: str) -> None:
        points, labels = two_blobs(self.seed)
        self.train_set = TensorDataset(points[:64], labels[:64])
        self.val_set = TensorDataset(points[64:], labels[64:])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=16)

    def predict_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=16)


class PartialData(PlainData):
    """A user's data module with part of the contract: its batch size, the ids of its predictions."""

    batch_size = 16
    id_name = "sample"

    @property
    def prediction_ids(self) -> list[str]:
        return [f"s{i}" for i in range(64, SAMPLES)]


FIT = ["--trainer.max_epochs", "2", "--trainer.accelerator", "cpu", "--seed_everything", "0"]


def run_recipe(task: type, data: type, out: str) -> pd.DataFrame:
    classes = ["--model", f"{__name__}.{task.__name__}", "--model.init_args.model", f"{__name__}.TinyNet",
               "--data", f"{__name__}.{data.__name__}"]
    main(["fit", *classes, *FIT])
    main(["predict", *classes, "--ckpt_path", "best", "--predictions_path", out])
    return pd.read_csv(out)


def test_a_plain_task_and_data_module_fit_and_predict_with_the_defaults(workdir: Path):
    table = run_recipe(PlainTask, PlainData, "plain.csv")
    assert list(table.columns) == ["row", "output_0", "output_1"]  # no prediction_columns, no prediction_ids
    assert table["row"].tolist() == list(range(SAMPLES - 64))
    fit = [run for run in runs_of(workdir, DEFAULT_EXPERIMENT) if "network" in run.data.params]
    assert fit and fit[-1].data.params["network"] == "PlainTask"  # no ``model`` member: the task itself
    best = list(workdir.glob("checkpoints/**/best.ckpt"))
    assert best
    ckpt = torch.load(best[0], map_location="cpu", weights_only=False)
    keys = [key for key in ckpt["callbacks"] if "'alias': 'best'" in key]
    assert keys and "'monitor': 'val/loss'" in keys[0] and "'mode': 'min'" in keys[0]  # the defaults


def test_a_partial_contract_is_used_where_it_is_implemented(workdir: Path):
    table = run_recipe(PartialTask, PartialData, "partial.csv")
    assert list(table.columns) == ["sample", "prediction"]
    assert table["sample"].tolist() == [f"s{i}" for i in range(64, SAMPLES)]
    fit = [run for run in runs_of(workdir, DEFAULT_EXPERIMENT) if "network" in run.data.params]
    assert fit[-1].data.params["network"] == "TinyNet" and fit[-1].data.params["batch_size"] == "16"
    assert set(table["prediction"]) <= {"left", "right"}
    best = list(workdir.glob("checkpoints/**/best.ckpt"))
    ckpt = torch.load(best[0], map_location="cpu", weights_only=False)
    keys = [key for key in ckpt["callbacks"] if "'alias': 'best'" in key]
    assert keys and "'monitor': 'val/acc'" in keys[0] and "'mode': 'max'" in keys[0]


def test_the_accessors_give_the_documented_defaults_to_plain_objects():
    task, data = PlainTask(TinyNet()), PlainData()
    assert task_contract.monitor_of(task) == "val/loss" and task_contract.monitor_mode_of(task) == "min"
    assert task_contract.default_monitor_of(PlainTask) == "val/loss"
    assert task_contract.data_mismatch_of(PlainTask, data) is None
    assert task_contract.network_of(task) is task
    assert task_contract.schedule_of(task) is None and task_contract.configured_schedule_of(task) is None
    assert task_contract.fine_tuning_of(task) is None and task_contract.weights_report_of(task) is None
    assert task_contract.confusion_matrices_of(task) is None
    assert not task_contract.clipping_measures_gradient_norm(task) and task_contract.measured_gradient_norm(task) is None
    assert task_contract.prediction_columns_of(task, torch.zeros(2, 2), data) is None
    assert data_contract.data_size(data, "num_classes") is None and data_contract.batch_size_of(data) is None
    assert data_contract.split_sizes_of(data) == {} and data_contract.split_datasets_of(data) is None
    assert data_contract.class_names_of(data) is None and data_contract.source_paths_of(data) == []
    assert not data_contract.predicts_new_data(data) and data_contract.new_data_of(data) is None
    assert data_contract.prediction_ids_of(data) == [] and data_contract.id_name_of(data) == "row"
    assert data_contract.raw_examples_of(data) is None
    assert data_contract.settings_outside_split(PlainData) == data_contract.LOADER_SETTINGS | {"predict_path", "prompt_path"}
    with pytest.raises(KeyError):
        data_contract.data_size(data, "colour")


def test_loopwise_classes_implement_the_contract():
    task = ClassificationModule(MLP(in_features=2, out_features=3), num_classes=3)
    for protocol in (task_contract.MonitoredTask, task_contract.MonitorMode, task_contract.ChecksData,
                     task_contract.HasNetwork, task_contract.HasSchedule, task_contract.DescribesSchedule,
                     task_contract.ExpectsInitialLoss, task_contract.ExplainsInitialLoss,
                     task_contract.MeasuresGradientNorm, task_contract.FineTunedTask,
                     task_contract.LoadsInitialWeights, task_contract.PredictionColumns,
                     task_contract.ConfusionMatrices, task_contract.DefaultMonitor):
        assert isinstance(task, protocol), protocol.__name__
    data = SpiralDataModule()
    for protocol in (data_contract.BatchSize, data_contract.SplitSizes, data_contract.SplitDatasets,
                     data_contract.PredictsNewData, data_contract.PredictionIds, data_contract.IdName,
                     data_contract.TableRows, data_contract.DataState):
        assert isinstance(data, protocol), protocol.__name__


def test_predictions_of_raw_rows_name_their_ids_without_writing_the_data_module():
    data = PartialData()
    header, rows = prediction_table(PlainTask(TinyNet()), data, torch.zeros(2, 2), ["a", "b"])
    assert header == ["sample", "output_0", "output_1"] and [row[0] for row in rows] == ["a", "b"]
    assert data.prediction_ids[0] == "s64"  # read, never written
