"""What Lightning's per-hook dispatch costs a loopwise task, removed without changing what it sees (issue 32): the
task's step methods keep their signatures. (The hook-name writes that skipped ``nn.Module.__setattr__`` went in
issue 54: a ``__setattr__`` override in the modules people import.)"""

from __future__ import annotations

import inspect
import sys
import types

import pytest
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

from lightning_modules import ClassificationModule, LanguageModelModule, RegressionModule
from lightning_modules.kept_signature import kept_signature
from lightning_modules.models import MLP

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
