"""NoOpProfiler: Lightning's default profiler without the per-hook cost of its ``@contextmanager`` (issue 32)."""

from __future__ import annotations

import sys
from collections import Counter

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from lightning_modules.no_op_profiler import NOTHING_TO_PROFILE, NoOpProfiler
from recipes import cli

from tests.conftest import SPIRAL


class HookCounter(Callback):
    """Counts the batch hooks Lightning calls on it."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def on_train_batch_start(self, *args, **kwargs) -> None:
        self.calls["on_train_batch_start"] += 1

    def on_before_optimizer_step(self, *args, **kwargs) -> None:
        self.calls["on_before_optimizer_step"] += 1

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.calls["on_train_batch_end"] += 1


def fit(profiler: PassThroughProfiler, callbacks: list[Callback] | None = None) -> tuple[ClassificationModule, int]:
    """Three optimizer steps of a tiny classifier; the module and the Python calls made during ``fit``."""
    torch.manual_seed(0)
    x, y = torch.randn(48, 4), torch.randint(0, 3, (48,))
    model = ClassificationModule(MLP(4, 3, [8]), num_classes=3)
    trainer = pl.Trainer(max_steps=3, profiler=profiler, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks or [])
    calls = [0]

    def count(frame, event, arg):  # noqa: ANN001
        if event == "call":
            calls[0] += 1

    sys.setprofile(count)
    try:
        trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=16))
    finally:
        sys.setprofile(None)
    assert trainer.profiler is profiler
    return model, calls[0]


def test_it_is_lightnings_default_profiler_that_hands_out_one_empty_context():
    profiler = NoOpProfiler()
    assert isinstance(profiler, PassThroughProfiler)  # what Lightning builds when no profiler is given
    with profiler.profile("[Callback]X.on_train_batch_start") as entered:
        assert entered is None
    assert profiler.profile("a") is profiler.profile("b") is NOTHING_TO_PROFILE
    with pytest.raises(KeyError, match="raised inside"), profiler.profile("a"):  # an error is never swallowed
        raise KeyError("raised inside")
    assert profiler.summary() == ""


def test_a_fit_calls_every_hook_and_trains_the_same_with_far_fewer_python_calls():
    counted = {}
    models = {}
    for name, profiler in (("default", PassThroughProfiler()), ("no-op", NoOpProfiler())):
        counter = HookCounter()
        models[name], counted[name] = fit(profiler, [counter])
        assert counter.calls == {"on_train_batch_start": 3, "on_before_optimizer_step": 3, "on_train_batch_end": 3}
    for a, b in zip(models["default"].parameters(), models["no-op"].parameters()):
        assert torch.equal(a, b)
    # each profiled action costs the default 8 Python frames (the @contextmanager helper, its __init__, __enter__ and
    # __exit__, the generator's start and resumption, start, stop) and the no-op profiler 3; a fit enters hundreds
    assert counted["default"] - counted["no-op"] > 300


def test_recipes_use_it_unless_the_config_names_a_profiler(workdir, built_trainers):
    cli.main(["fit", "-c", str(SPIRAL), "--trainer.fast_dev_run", "1", "--trainer.logger", "false"])
    cli.main(["fit", "-c", str(SPIRAL), "--trainer.fast_dev_run", "1", "--trainer.logger", "false",
              "--trainer.profiler", "simple"])
    # a barebones Trainer refuses every profiler (ValueError): it gets Lightning's own default
    cli.main(["validate", "-c", str(SPIRAL), "--trainer.barebones", "true", "--trainer.logger", "false",
              "--trainer.log_every_n_steps", "null", "--trainer.enable_progress_bar", "false",
              "--trainer.enable_model_summary", "false", "--ckpt_path", "none"])
    seen = [trainer.profiler for trainer in built_trainers]
    assert type(seen[0]) is NoOpProfiler
    assert type(seen[1]) is SimpleProfiler  # the user's choice is kept
    assert type(seen[2]) is PassThroughProfiler
