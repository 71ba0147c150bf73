"""The loop doctor as a member of the callback group, as the recipe runs it since issue 32 (point 2).

The group flattens the doctor: for the hooks the doctor forwards as they are, it calls the doctor's parts directly
(one table, one forwarding implementation), for the four it adds work to (setup, the batch timer's two, the summary)
it calls the doctor; after ``setup``, where the doctor builds a fit's parts, it reads the doctor's table again.

Every test of ``test_loop_doctor.py`` runs here a second time with the doctor inside a group (after a member with
batch hooks of its own, as in the recipe), with its assertions unchanged.
"""

from __future__ import annotations

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback

import tests.doctor.test_loop_doctor as alone
from recipes.callbacks import LoopDoctor
from recipes.callbacks.callback_group import CallbackGroup
from tests.doctor.test_loop_doctor import *  # noqa: F401,F403 (every test, run again with the doctor in a group)
from tests.doctor.test_loop_doctor import pytestmark  # noqa: F401


class BatchCounter(Callback):
    """A group member before the doctor, with batch hooks of its own."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1


def grouped_trainer(doctor: LoopDoctor, *callbacks: L.Callback, **kwargs) -> L.Trainer:
    trainer = ORIGINAL_TRAINER(CallbackGroup([BatchCounter(), doctor]), *callbacks, **kwargs)
    return trainer


ORIGINAL_TRAINER = alone.trainer


@pytest.fixture(autouse=True)
def doctor_in_a_group(monkeypatch):
    monkeypatch.setattr(alone, "trainer", grouped_trainer)


def test_the_group_calls_the_doctors_parts_directly_and_reads_its_table_after_setup():
    doctor = LoopDoctor()
    group = CallbackGroup([BatchCounter(), doctor])
    # the doctor's own hooks are called on it; every other hook's calls are the parts' bound methods
    assert group.hook_calls["on_train_batch_start"] == (doctor.on_train_batch_start,)
    assert group.hook_calls["on_train_end"] == (doctor.on_train_end,)
    assert group.hook_calls["setup"] == (doctor.setup,)
    assert group.hook_calls["on_validation_end"] == doctor.hook_calls["on_validation_end"]
    assert group.hook_calls["on_before_optimizer_step"] == doctor.hook_calls["on_before_optimizer_step"] != ()
    assert all(not isinstance(call.__self__, LoopDoctor) for call in group.hook_calls["on_validation_end"])
    before = doctor.parts
    trainer = ORIGINAL_TRAINER(group, max_steps=2)
    trainer.fit(alone.classifier(), alone.nan_row_data())
    assert doctor.parts is not before  # a fit's parts, built in the doctor's setup ...
    parts = {id(part) for part in doctor.parts}  # ... are the ones the group called after it
    assert all(id(call.__self__) in parts for calls in group.hook_calls.values() for call in calls
               if call.__self__ is not doctor and not isinstance(call.__self__, BatchCounter))
    assert group.members[0].batches == 2
