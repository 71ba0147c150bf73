"""Probes of every private Lightning and torch name behind lightning_modules/compat.py.

Each test exercises one entry of ``compat.PRIVATE_NAMES`` against the installed libraries. When an upgrade renames
or changes one of them, its probe fails with a message that names the compat function to update, instead of a recipe
changing behaviour silently.
"""

from __future__ import annotations

import importlib
import json
from unittest import mock

from pathlib import Path

import lightning
import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import nn

from lightning_modules import compat
from lightning_modules import read_steps
from recipes.compat import internals as recipes_compat

VERSIONS = f"lightning {lightning.__version__}, torch {torch.__version__}"


def upgrade_message(entry: str) -> str:
    where = "lightning_modules/compat.py" if entry in compat.PRIVATE_NAMES else "recipes/compat/internals.py"
    names = {**compat.PRIVATE_NAMES, **recipes_compat.PRIVATE_NAMES}
    return f"{VERSIONS} changed {names.get(entry, entry)}: update {entry} in {where} (and the code that calls it)"


def tiny_trainer(tmp_path: Path, **kwargs) -> Trainer:
    defaults = dict(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=4,
        limit_val_batches=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    return Trainer(**{**defaults, **kwargs})


PROBED: set[str] = set()


def probes(entry: str):
    """Register the decorated test as the probe of ``compat.PRIVATE_NAMES[entry]``."""
    PROBED.add(entry)
    return lambda test: test


def test_a_task_knows_when_lightningcli_built_it() -> None:
    """The ``_instantiator`` entry LightningCLI writes into a module's hyperparameters (and checkpoint) is what
    ``Task.built_from_config`` reads: from a config the network's class path is kept, built in Python it is not."""
    from lightning_modules import ClassificationModule
    from lightning_modules.models import MLP

    in_python = ClassificationModule(MLP(in_features=2, out_features=3), num_classes=3)
    assert not in_python.built_from_config() and "model" not in in_python.hparams
    model = {"class_path": "lightning_modules.models.MLP", "init_args": {"in_features": 2, "out_features": 3}}
    cli = LightningCLI(ClassificationModule, BoringDataModule, args=["--model.model", json.dumps(model),
                       "--model.num_classes", "3"], run=False, save_config_callback=None)
    assert cli.model.built_from_config(), "LightningCLI no longer writes _instantiator into hparams: update Task.built_from_config"
    assert cli.model.hparams["model"]["class_path"] == "lightning_modules.models.MLP"


@probes("is_compiled_in_place")
def test_is_compiled_in_place_sees_module_compile() -> None:
    module = nn.Linear(2, 2)
    assert not compat.is_compiled_in_place(module), upgrade_message("is_compiled_in_place")
    module.compile()  # lazy: nothing is compiled until the first call
    assert compat.is_compiled_in_place(module), upgrade_message("is_compiled_in_place")


@probes("optimizer_has_stepped")
def test_optimizer_has_stepped_without_any_state() -> None:
    weight = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)  # plain SGD keeps no state
    torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # wraps optimizer.step to count the calls
    assert not compat.optimizer_has_stepped(optimizer), upgrade_message("optimizer_has_stepped")
    weight.sum().backward()
    optimizer.step()
    assert not optimizer.state
    assert compat.optimizer_has_stepped(optimizer), upgrade_message("optimizer_has_stepped")


@probes("BATCH_AND_INSTANCE_NORM")
def test_batch_and_instance_norm_base() -> None:
    for norm in (nn.BatchNorm1d, nn.BatchNorm2d, nn.InstanceNorm2d, nn.SyncBatchNorm):
        assert issubclass(norm, compat.BATCH_AND_INSTANCE_NORM), upgrade_message("BATCH_AND_INSTANCE_NORM")
    assert not issubclass(nn.LayerNorm, compat.BATCH_AND_INSTANCE_NORM)


@probes("hold_stop_request")
def test_hold_stop_request_withdraws_lightnings_stop(tmp_path: Path) -> None:
    held = []

    class StopThenHold(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 0:
                recipes_compat.stop_after_this_batch(trainer)
                held.append(recipes_compat.hold_stop_request(trainer))
                held.append(recipes_compat.hold_stop_request(trainer))

    trainer = tiny_trainer(tmp_path, callbacks=[StopThenHold()])
    trainer.fit(BoringModel())  # no SIGTERMException: the request was withdrawn
    assert held == [True, False] and trainer.global_step == 4, upgrade_message("hold_stop_request")


@probes("stop_after_this_batch")
@probes("can_stop_after_this_batch")
def test_stop_after_this_batch_raises_lightnings_sigterm_exception(tmp_path: Path) -> None:
    batches = []

    class StopAtSecond(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            batches.append(batch_idx)
            if batch_idx == 1:
                recipes_compat.stop_after_this_batch(trainer)

    trainer = tiny_trainer(tmp_path, callbacks=[StopAtSecond()])
    assert recipes_compat.can_stop_after_this_batch(trainer), upgrade_message("can_stop_after_this_batch")
    with pytest.raises(SIGTERMException):
        trainer.fit(BoringModel())
    assert batches == [0, 1], upgrade_message("stop_after_this_batch")


def test_epoch_batches_done_after_the_last_batch(tmp_path: Path) -> None:
    seen = []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(("batch", batch_idx, read_steps.epoch_batches_done(trainer)))

        def on_validation_end(self, trainer, pl_module) -> None:
            if not trainer.sanity_checking:
                seen.append(("validation", None, read_steps.epoch_batches_done(trainer)))

    tiny_trainer(tmp_path, callbacks=[Watch()], num_sanity_val_steps=0).fit(BoringModel())
    # the last batch is "ready" (fetched) when its on_train_batch_start runs
    expected = [("batch", 0, False), ("batch", 1, False), ("batch", 2, False), ("batch", 3, True)]
    assert seen == expected + [("validation", None, True)], upgrade_message(
        "epoch_batches_done"
    )


@probes("is_logging_step")
def test_is_logging_step_matches_the_steps_lightning_logs(tmp_path: Path) -> None:
    seen, logged = [], []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(recipes_compat.is_logging_step(trainer))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            assert recipes_compat.is_logging_step(trainer) == seen[-1], upgrade_message("is_logging_step")

    class Recorder(lightning.pytorch.loggers.Logger):
        name, version = "recorder", "0"

        def log_hyperparams(self, params, *args, **kwargs) -> None:
            pass

        def log_metrics(self, metrics, step=None) -> None:
            if "loss" in metrics:
                logged.append(step)

    class Logs(BoringModel):
        def training_step(self, batch, batch_idx):
            out = super().training_step(batch, batch_idx)
            self.log("loss", out["loss"], on_step=True, on_epoch=False)
            return out

    trainer = tiny_trainer(tmp_path, callbacks=[Watch()], logger=Recorder(), log_every_n_steps=3, max_epochs=2,
                           num_sanity_val_steps=0)
    trainer.fit(Logs())
    assert [i for i, flag in enumerate(seen) if flag] == logged == [2, 5], upgrade_message("is_logging_step")


@probes("time_train_fetches")
def test_time_train_fetches_brackets_every_fetch(tmp_path: Path) -> None:
    calls = []

    class Timed(Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            hooked = recipes_compat.time_train_fetches(trainer, lambda: calls.append("before"), lambda: calls.append("after"))
            assert hooked, upgrade_message("time_train_fetches")

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            calls.append("batch")

        def on_train_end(self, trainer, pl_module) -> None:
            recipes_compat.untime_train_fetches(trainer)

    trainer = tiny_trainer(tmp_path, callbacks=[Timed()])
    trainer.fit(BoringModel())
    assert calls[:3] == ["before", "after", "batch"], upgrade_message("time_train_fetches")
    assert calls.count("batch") == 4
    assert calls.count("before") == calls.count("after") >= 4, upgrade_message("time_train_fetches")
    assert "_on_before_fetch" not in vars(trainer.fit_loop.epoch_loop), upgrade_message("time_train_fetches")


@probes("strategy_checkpoint_io_is_set")
def test_strategy_checkpoint_io_is_set() -> None:
    cpu = torch.device("cpu")
    assert not recipes_compat.strategy_checkpoint_io_is_set(SingleDeviceStrategy(cpu)), upgrade_message(
        "strategy_checkpoint_io_is_set"
    )
    given = SingleDeviceStrategy(cpu, checkpoint_io=TorchCheckpointIO())
    assert recipes_compat.strategy_checkpoint_io_is_set(given), upgrade_message("strategy_checkpoint_io_is_set")


@probes("saved_train_loader_states")
def test_saved_train_loader_states_are_what_the_stateful_loader_returned(tmp_path: Path) -> None:
    class Stateful(torch.utils.data.DataLoader):
        def state_dict(self) -> dict:
            return {"position": 3}

        def load_state_dict(self, state: dict) -> None:
            pass

    class Model(BoringModel):
        def train_dataloader(self):
            return Stateful(torch.randn(8, 32), batch_size=2)

    trainer = tiny_trainer(tmp_path)
    trainer.fit(Model())
    trainer.save_checkpoint(tmp_path / "probe.ckpt")
    checkpoint = torch.load(tmp_path / "probe.ckpt", weights_only=True)
    assert recipes_compat.saved_train_loader_states(checkpoint) == [{"position": 3}], upgrade_message(
        "saved_train_loader_states"
    )
    assert recipes_compat.saved_train_loader_states({}) == []


@probes("SubcommandErrorHook")
def test_subcommand_error_hook_sees_the_error_of_fit(tmp_path: Path) -> None:
    seen = []

    class Failing(BoringModel):
        def training_step(self, batch, batch_idx):
            raise ValueError("broken step")

    class HookedCLI(recipes_compat.SubcommandErrorHook, LightningCLI):
        def on_subcommand_error(self, subcommand: str, error: Exception) -> None:
            seen.append((subcommand, str(error)))
            raise RuntimeError("handled") from error

    args = ["fit", "--trainer.fast_dev_run=1", "--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(RuntimeError, match="handled"):
        HookedCLI(Failing, BoringDataModule, args=args)
    assert seen == [("fit", "broken step")], upgrade_message("SubcommandErrorHook")


@probes("ConfigDumpWithInitArgs")
def test_a_network_whose_every_argument_is_a_linked_size_builds(tmp_path: Path, workdir: Path) -> None:
    from recipes.cli import main

    (tmp_path / "net.yaml").write_text(
        "model:\n  class_path: lightning_modules.ClassificationModule\n  init_args:\n    model:\n"
        "      class_path: tests.stand_in_backbones.TinyResNet\n"
        "data:\n  class_path: datamodules.DigitsDataModule\n"
    )
    try:
        main(["fit", "-c", "net.yaml", "--trainer.fast_dev_run", "1"])  # num_classes and in_channels both linked
    except SystemExit as err:
        raise AssertionError(upgrade_message("ConfigDumpWithInitArgs")) from err


@probes("checkpoint_state_key")
def test_checkpoint_state_key_is_what_lightning_stores() -> None:
    callback = ModelCheckpoint(monitor="val/acc", mode="max")
    key = recipes_compat.checkpoint_state_key(
        callback,
        monitor="val/acc",
        mode="max",
        every_n_train_steps=0,
        every_n_epochs=1,
        train_time_interval=None,
    )
    assert key == callback.state_key, upgrade_message("checkpoint_state_key")


@probes("skip_batch_hooks")
def test_skip_batch_hooks_makes_lightning_skip_them_without_a_profiled_call(tmp_path: Path) -> None:
    from lightning.pytorch.profilers import PassThroughProfiler

    class Recording(PassThroughProfiler):
        def __init__(self) -> None:
            super().__init__()
            self.actions: list[str] = []

        def start(self, action_name: str) -> None:
            self.actions.append(action_name)

    class Counting(Callback):
        def __init__(self) -> None:
            self.ends = 0

        def on_train_batch_end(self, *args) -> None:
            self.ends += 1

    plain, counting = Callback(), Counting()
    recipes_compat.skip_batch_hooks(plain)
    recipes_compat.skip_batch_hooks(counting)  # keeps the hook its class overrides
    assert counting.on_train_batch_end is not None and plain.on_train_batch_end is None
    trainer = tiny_trainer(tmp_path, callbacks=[plain, counting])
    trainer.profiler = profiler = Recording()
    trainer.fit(BoringModel())
    message = upgrade_message("skip_batch_hooks")
    assert counting.ends == 4, message
    batch_hooks = [a for a in profiler.actions if a.startswith("[Callback]") and a.rsplit(".", 1)[1] in recipes_compat.BATCH_HOOKS]
    assert batch_hooks and all(a.endswith("Counting.on_train_batch_end") for a in batch_hooks), message
    assert "[Callback]Callback.on_train_start" in profiler.actions, message  # the other hooks still run
    own = Callback()
    own.on_train_batch_start = lambda *args: None  # a hook set on the instance is kept
    assert recipes_compat.skip_batch_hooks(own).on_train_batch_start is not None and own.on_train_batch_end is None
    recipes_compat.skip_batch_hooks(counting, needed=())  # and back: an explicit list restores the class's hook
    assert counting.on_train_batch_end is None
    recipes_compat.skip_batch_hooks(counting, needed=("on_train_batch_end",))
    assert counting.on_train_batch_end.__func__ is Counting.on_train_batch_end


@probes("mlflow_logger_*")
def test_mlflow_logger_private_state(tmp_path: Path) -> None:
    logger = MLFlowLogger(
        experiment_name="compat", tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", log_model="all", synchronous=False
    )
    message = upgrade_message("mlflow_logger_*")
    assert recipes_compat.mlflow_logger_experiment_name(logger) == "compat", message
    assert recipes_compat.mlflow_logger_log_model(logger) == "all", message
    assert recipes_compat.mlflow_logger_run_created(logger) is False, message
    assert isinstance(recipes_compat.mlflow_logger_uploaded_files(logger), dict), message
    recipes_compat.mlflow_logger_forget_checkpoints(logger)
    assert logger._checkpoint_callback is None, message
    assert logger.run_id is not None
    assert recipes_compat.mlflow_logger_run_created(logger) is True, message


@probes("keep_hyperparameters_from_loggers")
def test_keep_hyperparameters_from_loggers_stops_lightnings_call(tmp_path: Path) -> None:
    from lightning.pytorch.loggers import CSVLogger
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_modules import ClassificationModule
    from lightning_modules.models import MLP

    module = ClassificationModule(MLP(2, 3, [4]), 3)
    recipes_compat.keep_hyperparameters_from_loggers(module)
    logger = CSVLogger(tmp_path, name="run")
    trainer = Trainer(max_steps=1, logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", limit_val_batches=0)
    x, y = torch.randn(8, 2), torch.randint(0, 3, (8,))
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=8))
    assert logger.experiment.hparams == {}, upgrade_message("keep_hyperparameters_from_loggers")


def test_every_private_name_has_a_probe() -> None:
    assert PROBED == set(compat.PRIVATE_NAMES) | set(recipes_compat.PRIVATE_NAMES), (
        "add a probe here for each entry of lightning_modules/compat.py's and recipes/compat/internals.py's PRIVATE_NAMES")
