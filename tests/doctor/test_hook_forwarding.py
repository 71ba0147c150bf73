"""One hook forwarding (``recipes.hooks.forwarding``) for the callback group, the loop doctor and a check used alone:
each hook goes only to the members that need it, in their order; the doctor keeps its checks, their order, its
``state_key`` and its (empty) checkpoint state, so checkpoints written before the change resume."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from recipes.doctor.base import CALLBACK_HOOKS
from recipes.doctor.current_step import STEP_HOOKS, CurrentStep
from recipes.doctor.gradient_norm import GradientNormCheck
from recipes.doctor.loop_doctor import LoopDoctor
from recipes.doctor.non_finite import NonFiniteCheck
from recipes.hooks.forwarding import HOOKS, ForwardingCallback, defined_hooks, defines
from recipes.callbacks.callback_group import FORWARDED, CallbackGroup

pytestmark = [
    pytest.mark.filterwarnings("ignore::recipes.doctor.findings.LoopDoctorWarning"),
    pytest.mark.usefixtures("one_thread"),
]

# the hooks Lightning calls on every callback at every training step
STEP = ("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_zero_grad",
        "on_before_optimizer_step", "on_train_batch_end")


class Recorder(Callback):
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    def on_train_start(self, trainer, pl_module) -> None:
        self.calls.append(f"{self.name}.on_train_start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.calls.append(f"{self.name}.on_train_batch_end({batch_idx})")


def test_forwarding_calls_the_members_that_name_a_hook_in_their_order():
    calls: list[str] = []
    a, b = Recorder("a", calls), Recorder("b", calls)
    forwarding = ForwardingCallback([(a, ["on_train_start", "on_train_batch_end"]), (b, ["on_train_batch_end"])])
    forwarding.on_train_start(None, None)
    forwarding.on_train_batch_end(None, None, None, None, 3)
    forwarding.on_validation_end(None, None)  # no member: nothing
    assert calls == ["a.on_train_start", "a.on_train_batch_end(3)", "b.on_train_batch_end(3)"]
    assert forwarding.hook_calls["on_validation_end"] == ()
    with pytest.raises(TypeError, match="ForwardingCallback does not forward on_nothing .needed by Recorder."):
        forwarding.forward_to([(a, ["on_nothing"])])


def test_forwarders_take_lightnings_arguments_as_lightning_passes_them():
    seen: list[tuple] = []

    class Member(Callback):
        def setup(self, trainer, pl_module, stage) -> None:
            seen.append(("setup", stage))

        def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # no dataloader_idx
            seen.append(("val", batch, batch_idx))

        def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
            seen.append(("test", batch_idx, dataloader_idx))

    member = Member()
    forwarding = ForwardingCallback([(member, defined_hooks(member))])
    forwarding.setup(None, None, stage="fit")  # Lightning passes the stage by keyword
    forwarding.on_validation_batch_start(None, None, "b", 1)  # one loader: no dataloader_idx
    forwarding.on_test_batch_start(None, None, "b", 2, 1)  # several loaders: dataloader_idx given
    assert seen == [("setup", "fit"), ("val", "b", 1), ("test", 2, 1)]
    assert ForwardingCallback.on_train_start.__qualname__ == "ForwardingCallback.on_train_start"


def test_defines_and_the_hook_list():
    assert FORWARDED == HOOKS and "setup" in HOOKS and "teardown" in HOOKS and "state_dict" not in HOOKS
    assert CALLBACK_HOOKS == tuple(name for name in HOOKS if name != "setup")
    assert set(defined_hooks(Recorder("a", []))) == {"on_train_start", "on_train_batch_end"}
    assert defines(Recorder("a", []), "on_train_start") and not defines(Recorder("a", []), "on_train_end")


def test_the_group_the_doctor_and_a_check_alone_forward_with_the_one_mechanism():
    group = CallbackGroup([Recorder("a", [])])
    assert isinstance(group, ForwardingCallback) and isinstance(LoopDoctor(), ForwardingCallback)
    assert isinstance(NonFiniteCheck(), ForwardingCallback)
    assert group.hook_calls["on_train_start"] and not group.hook_calls["on_train_end"]
    # the doctor writes only the hooks it adds work to; every other hook is the mechanism's forwarder
    own = {name for name in HOOKS if name in vars(LoopDoctor)}
    assert own == {"setup", "on_train_end", "on_train_batch_start", "on_train_batch_end"}
    assert not {name for name in HOOKS if name in vars(NonFiniteCheck) or name in vars(GradientNormCheck)}


def test_the_doctor_forwards_each_hook_only_to_the_parts_that_define_it_in_their_order():
    doctor = LoopDoctor()
    order = [type(part).__name__ for part in doctor.parts]
    assert order == ["CurrentStep", "TrainEvalModeCheck", "LeakageCheck", "DataWaitCheck", "NonFiniteCheck",
                     "InitialLossCheck", "GradientNormCheck", "ScheduleCheck", "UnusedParametersCheck",
                     "TrivialBaselineCheck"]
    for name, calls in doctor.hook_calls.items():
        owners = [type(call.__self__).__name__ for call in calls]
        assert owners == [o for o in order if o in owners], name  # the parts' order
        for call in calls:
            assert call.__func__ is not getattr(Callback, name), f"{name}: an empty base hook is called"
            assert name in call.__self__.hooks(), name
    # the data-wait timer brackets the batch hooks itself; setup builds the parts, it is not forwarded
    assert [type(c.__self__).__name__ for c in doctor.hook_calls["on_train_batch_start"]] == [
        "CurrentStep", "TrainEvalModeCheck"]
    assert doctor.hook_calls["setup"] == ()
    # a step calls no part for the hooks no part needs
    assert doctor.hook_calls["on_after_backward"] == () and doctor.hook_calls["on_before_zero_grad"] == ()
    nothing = LoopDoctor(initial_loss=False, non_finite=False, grad_norm=False, data_wait=False, leakage=False,
                         schedule_check=False, mode_check=False, unused_parameters=False, baseline=False)
    assert all(calls == () for calls in nothing.hook_calls.values())


def test_a_check_alone_forwards_the_step_hooks_to_its_own_step_and_a_shared_one_none():
    alone = NonFiniteCheck()
    assert alone.records_step and isinstance(alone.step, CurrentStep)
    assert {name for name, calls in alone.hook_calls.items() if calls} == set(STEP_HOOKS)
    assert all(call.__self__ is alone.step for calls in alone.hook_calls.values() for call in calls)
    # hooks() as before the change: the step hooks in Lightning's order
    assert alone.hooks() == tuple(name for name in CALLBACK_HOOKS if name in STEP_HOOKS)
    shared = NonFiniteCheck(step=CurrentStep())
    assert shared.hooks() == () and all(calls == () for calls in shared.hook_calls.values())


def test_a_part_that_asks_for_setup_is_refused(monkeypatch):
    import recipes.doctor.loop_doctor as loop_doctor

    class AsksForSetup(loop_doctor.UnusedParametersCheck):
        def hooks(self) -> tuple[str, ...]:
            return ("setup",)

    monkeypatch.setattr(loop_doctor, "UnusedParametersCheck", AsksForSetup)
    with pytest.raises(TypeError, match="LoopDoctor does not forward setup .needed by AsksForSetup."):
        LoopDoctor()


# --- checkpoints: the doctor's state key and (empty) state are as before, so old checkpoints resume -------------
def tiny_fit(tmp_path, max_epochs: int, ckpt_path: str | None = None) -> tuple[L.Trainer, LoopDoctor]:
    L.seed_everything(0)
    x, y = torch.randn(64, 2), torch.randint(0, 3, (64,))
    train = DataLoader(TensorDataset(x, y), batch_size=16)
    val = DataLoader(TensorDataset(x[:16], y[:16]), batch_size=16)
    doctor = LoopDoctor()
    trainer = L.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False,
                        callbacks=[doctor], default_root_dir=tmp_path)
    trainer.fit(ClassificationModule(MLP(2, 3, [8]), 3), train, val, ckpt_path=ckpt_path)
    return trainer, doctor


def test_a_checkpoint_in_the_old_format_resumes_with_the_doctor(tmp_path):
    doctor = LoopDoctor()
    assert doctor.state_key == "LoopDoctor" and doctor.state_dict() == {}  # as before: nothing stored
    trainer, _ = tiny_fit(tmp_path, 1)
    path = tmp_path / "old.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    assert not any("LoopDoctor" in key for key in checkpoint["callbacks"])
    # the old format, by hand: a state under the doctor's key (none was ever written) is ignored as before
    checkpoint["callbacks"]["LoopDoctor"] = {}
    torch.save(checkpoint, path)
    resumed, doctor = tiny_fit(tmp_path, 2, ckpt_path=str(path))
    assert resumed.global_step == 8 and resumed.current_epoch == 2
    assert [epoch for epoch, _ in doctor.data_wait_fractions] == [1]  # the doctor's hooks ran in the resumed epoch
