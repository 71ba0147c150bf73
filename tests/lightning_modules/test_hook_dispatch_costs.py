"""What Lightning's per-hook dispatch costs a loopwise task, removed without changing what it sees (issue 32):
the task's hook-name writes skip ``nn.Module.__setattr__`` and its step methods keep their signatures."""

from __future__ import annotations

import inspect
import sys
import types
from unittest import mock

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule, LanguageModelModule, RegressionModule
from lightning_modules.compat import QuickHookNameWrites
from lightning_modules.kept_signature import kept_signature
from lightning_modules.models import MLP
from lightning_modules.task import Task

STEPS = [(ClassificationModule, "training_step"), (ClassificationModule, "validation_step"),
         (ClassificationModule, "test_step"), (ClassificationModule, "predict_step"),
         (RegressionModule, "predict_step"), (LanguageModelModule, "predict_step")]


def unkept(method: types.FunctionType) -> types.FunctionType:
    """The same function without a kept ``__signature__``."""
    copy = types.FunctionType(method.__code__, method.__globals__, method.__name__, method.__defaults__,
                              method.__closure__)
    copy.__annotations__, copy.__kwdefaults__ = method.__annotations__, method.__kwdefaults__
    return copy


@pytest.mark.parametrize(("task", "name"), STEPS)
def test_a_kept_signature_reads_as_the_one_built_from_the_code(task: type, name: str) -> None:
    method = getattr(task, name)
    assert "__signature__" in vars(method)
    assert inspect.getfullargspec(method) == inspect.getfullargspec(unkept(method))
    assert inspect.signature(method) == inspect.signature(unkept(method))


def test_lightning_reads_the_kept_signature_without_building_it() -> None:
    module, overriding = ClassificationModule(MLP(2, 3, [4]), num_classes=3), Overriding()
    built: list[str] = []

    def watch(frame, event, arg):  # noqa: ANN001
        if event == "call" and frame.f_code.co_name == "_signature_from_function":
            built.append(frame.f_code.co_filename)

    sys.setprofile(watch)
    try:
        passes_batch_idx = is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)
        own = is_param_in_hook_signature(overriding.training_step, "batch_idx", min_args=2)
    finally:
        sys.setprofile(None)
    assert passes_batch_idx and not own
    assert len(built) == 1  # only the subclass's own override, read as usual


class Overriding(ClassificationModule):
    def __init__(self) -> None:
        super().__init__(MLP(2, 3, [4]), num_classes=3)

    def training_step(self, batch):  # noqa: ANN001, ANN201  (no batch_idx: Lightning must not pass one)
        return super().training_step(batch, 0)


def test_kept_signature_returns_the_method_itself() -> None:
    def step(self, batch, batch_idx: int = 0):  # noqa: ANN001, ANN202
        return batch

    assert kept_signature(step) is step and list(inspect.signature(step).parameters) == ["self", "batch", "batch_idx"]


def test_a_tasks_fit_writes_the_hook_name_and_gradient_norm_without_module_setattr(tmp_path) -> None:
    assert issubclass(Task, QuickHookNameWrites) and {"_current_fx_name", "gradient_norm"} <= Task.plain_attributes
    torch.manual_seed(0)
    x, y = torch.randn(48, 2), torch.randint(0, 3, (48,))
    module = ClassificationModule(MLP(2, 3, [8]), num_classes=3)
    trainer = pl.Trainer(max_epochs=1, gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    writes: list[str] = []
    original = nn.Module.__setattr__

    def counted(self, name, value):  # noqa: ANN001
        writes.append(name)
        original(self, name, value)

    with mock.patch.object(nn.Module, "__setattr__", counted):
        trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=16))
    assert trainer.global_step == 3
    assert "_current_fx_name" not in writes and "gradient_norm" not in writes
    assert isinstance(vars(module)["gradient_norm"], torch.Tensor)  # the norm clipping measured, kept as before
    assert module._current_fx_name is None


def test_quick_writes_leave_buffers_registered_names_and_properties_to_nn_module() -> None:
    class Module(QuickHookNameWrites, nn.Module):
        plain_attributes = QuickHookNameWrites.plain_attributes | {"norm", "shown", "weight"}

        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        @property
        def shown(self) -> str:
            return self.seen[-1]

        @shown.setter
        def shown(self, value: str) -> None:
            self.seen.append(value)

    module = Module()
    module.norm = torch.ones(2)  # a plain tensor under a listed name: straight into __dict__
    assert "norm" in vars(module) and not dict(module.named_buffers())
    module.shown = "x"  # a property of the class: its setter runs
    assert module.seen == ["x"] and module.shown == "x" and "shown" not in vars(module)
    del module.norm
    module.norm = nn.Buffer(torch.zeros(1))  # an nn.Buffer registers, as nn.Module does it
    assert "norm" in dict(module.named_buffers()) and "norm" not in vars(module)
    module.norm = torch.ones(1)  # a registered buffer's name: the buffer is replaced, not shadowed
    assert module.state_dict()["norm"].tolist() == [1.0] and "norm" not in vars(module)
    module.weight = nn.Parameter(torch.ones(1))
    with pytest.raises(TypeError):  # nn.Module's own refusal of a plain tensor over a parameter
        module.weight = torch.zeros(1)
