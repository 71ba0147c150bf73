"""Stateful callbacks inside the callback group keep their checkpoint state under their own keys (issue 32 point 2).

``tests/data/checkpoint_before_the_group/last.ckpt`` was written by commit 3e8e38c, when ``RandomStates`` and
``PlateauStepOnResume`` were callbacks of the Trainer on their own (ORIGIN.md there): the current code resumes from
it with their states restored (random generators, the plateau's record, the train loader's position), and the
checkpoints it writes have the same callback entries. On the old code ``CallbackGroup`` refused such members
(``ValueError: ... keep checkpoint state``).
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.demos.boring_classes import BoringModel

from recipes import cli
from recipes.run.recipes_cli import RecipesCLI
from recipes.callbacks.plateau_resume import PlateauStepOnResume
from recipes.callbacks.random_states import RandomStates
from recipes.callbacks.callback_group import CallbackGroup
from recipes.run.callback_table import flat
from tests.conftest import REPO, SPIRAL

OLD = REPO / "tests" / "data" / "checkpoint_before_the_group" / "last.ckpt"
# the arguments of the fit that wrote it (ORIGIN.md), without the crash
ARGS = [
    "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2",
    "--checkpoint_every_n_steps", "4",
    "--model.init_args.schedule",
    '{"class_path":"lightning_modules.optim.Plateau","init_args":{"patience":0,"factor":0.5}}',
    "--mlflow_model", "false", "--system_metrics_interval", "0",
]  # fmt: skip


class Counter(Callback):
    """A stateful callback: counts training batches; its count is its checkpoint state."""

    def __init__(self) -> None:
        self.batches = 0
        self.loaded: dict | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.batches += 1

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict) -> None:
        self.loaded = state_dict
        self.batches = state_dict["batches"]


def boring_fit(tmp_path: Path, callbacks: list, ckpt_path: Path | None = None, steps: int = 3) -> Path:
    trainer = pl.Trainer(
        max_steps=steps, callbacks=callbacks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(BoringModel(), ckpt_path=ckpt_path)
    out = tmp_path / f"after-{steps}.ckpt"
    trainer.save_checkpoint(out)
    return out


def test_a_group_writes_its_members_states_under_their_own_keys_and_both_layouts_resume_each_other(tmp_path):
    torch.manual_seed(0)
    alone = boring_fit(tmp_path / "alone", [Counter(), RandomStates()])
    torch.manual_seed(0)
    grouped = boring_fit(tmp_path / "grouped", [CallbackGroup([Counter(), RandomStates()])])
    a, b = (torch.load(p, weights_only=False)["callbacks"] for p in (alone, grouped))
    assert list(a) == list(b) == ["Counter", "RandomStates"]  # no key of the group's own; the members' order
    assert a["Counter"] == b["Counter"] == {"batches": 3}
    assert torch.equal(a["RandomStates"]["torch"], b["RandomStates"]["torch"])

    # stand-alone checkpoint -> group, and group checkpoint -> stand-alone
    member = Counter()
    boring_fit(tmp_path / "into-group", [CallbackGroup([RandomStates(), member])], ckpt_path=alone, steps=5)
    assert member.loaded == {"batches": 3} and member.batches == 5
    single = Counter()
    boring_fit(tmp_path / "into-alone", [single, RandomStates()], ckpt_path=grouped, steps=5)
    assert single.loaded == {"batches": 3} and single.batches == 5


def test_a_member_state_key_that_another_trainer_callback_has_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="another callback with checkpoint state under Counter"):
        boring_fit(tmp_path, [CallbackGroup([Counter(), RandomStates()]), Counter()])


class Probe(Callback):
    """Records, at the first training batch of the resumed fit: the generators' states, the epoch, batch and step."""

    def __init__(self) -> None:
        self.first: dict | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first is None:
            self.first = {"epoch": trainer.current_epoch, "batch_idx": batch_idx, "step": trainer.global_step}


def test_a_checkpoint_written_before_the_group_resumes_with_every_callback_state(workdir, monkeypatch, built_trainers):
    old = torch.load(OLD, weights_only=True)
    assert set(old["callbacks"]) >= {"RandomStates", "PlateauStepOnResume"}
    ckpt = workdir / "before_the_group.ckpt"
    shutil.copy(OLD, ckpt)

    given: dict[str, dict] = {}
    generators: dict[str, object] = {}
    load_random, load_plateau = RandomStates.load_state_dict, PlateauStepOnResume.load_state_dict

    def random_loaded(self, state):
        given["RandomStates"] = state
        load_random(self, state)
        generators.update(torch=torch.get_rng_state(), numpy=np.random.get_state(), python=random.getstate())

    def plateau_loaded(self, state):
        given["PlateauStepOnResume"] = state
        load_plateau(self, state)

    monkeypatch.setattr(RandomStates, "load_state_dict", random_loaded)
    monkeypatch.setattr(PlateauStepOnResume, "load_state_dict", plateau_loaded)
    probe = Probe()
    original = RecipesCLI.default_callbacks
    monkeypatch.setattr(RecipesCLI, "default_callbacks", lambda self, cfg: original(self, cfg) + [probe])
    cli.main(["fit", "-c", str(SPIRAL), *ARGS, "--ckpt_path", str(ckpt)])
    [trainer] = built_trainers
    seen = list(trainer.callbacks)

    # the stateful callbacks ran inside the group (on the old code they stood alone)
    [group] = [c for c in seen if isinstance(c, CallbackGroup)]
    assert {type(m).__name__ for m in group.stateful} == {"RandomStates", "PlateauStepOnResume"}
    assert not [c for c in seen if isinstance(c, (RandomStates, PlateauStepOnResume))]
    # each got what the file holds under its own key, and the generators are the file's
    held = old["callbacks"]
    assert given["PlateauStepOnResume"] == held["PlateauStepOnResume"] == {
        "pending": False, "epoch": 1, "metrics": {"val/acc": 0.546875}
    }  # fmt: skip
    assert torch.equal(generators["torch"], held["RandomStates"]["torch"])
    assert np.array_equal(generators["numpy"][1], held["RandomStates"]["numpy"]["keys"].numpy().astype(np.uint32))
    assert list(generators["python"][1]) == held["RandomStates"]["python"]["state"].tolist()
    # the train loader goes on at the saved position: epoch 1, batch 2 (step 8)
    assert old["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": 2}]
    assert probe.first == {"epoch": 1, "batch_idx": 2, "step": 8}

    # the checkpoints the resumed fit writes have the old file's callback entries, key for key
    [new] = list((workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt"))
    written = torch.load(new, weights_only=True)
    assert written["global_step"] == 12
    assert list(written["callbacks"]) == list(held)  # the same keys in the same order
    for key in held:
        assert set(written["callbacks"][key]) == set(held[key]), key
    assert written["callbacks"]["PlateauStepOnResume"]["epoch"] == 1
    assert set(written["callbacks"]["PlateauStepOnResume"]["metrics"]) == {"val/acc"}


def test_the_recipe_trainer_finds_its_checkpoints_and_early_stopping_outside_the_group():
    """Lightning finds checkpoints and early stopping by type in ``trainer.callbacks`` (not inside a group): the
    table keeps them alone; every other recipe callback is one group member."""
    from tests.run.test_recipe_callbacks import run_of
    from recipes.run.callback_table import recipe_callbacks

    built = recipe_callbacks(run_of("fit"))
    trainer = pl.Trainer(callbacks=built, logger=False, enable_progress_bar=False, enable_model_summary=False)
    assert [c.alias for c in trainer.checkpoint_callbacks] == ["best", "last"]
    assert trainer.checkpoint_callback is trainer.checkpoint_callbacks[0]
    assert type(trainer.early_stopping_callback).__name__ == "RecipeEarlyStopping"
    assert sum(isinstance(c, CallbackGroup) for c in trainer.callbacks) == 1
    assert "LoopDoctor" == type(flat(built)[len(built[0].members) - 1]).__name__
