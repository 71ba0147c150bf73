"""The recipe's callbacks and their order come from one table (recipes/run/callback_table.py)."""

from __future__ import annotations

import pytest

from recipes import cli
from recipes.run.recipes_cli import RecipesCLI
from recipes.callbacks.callback_group import CallbackGroup
from recipes.run.callback_table import RECIPE_CALLBACKS, RecipeRun, callback_names, flat, recipe_callbacks

from tests.conftest import SPIRAL


def run_of(stage: str, **overrides) -> RecipeRun:
    settings = dict(
        stage=stage,
        experiment="spiral_mlp",
        checkpoints_dir="checkpoints",
        monitor="val/acc",
        monitor_mode="max",
        tracked=True,
        early_stopping_patience=5,
        loop_doctor={},
        interactive=False,
    )
    return RecipeRun(**{**settings, **overrides})


def test_fit_gets_every_fit_callback_in_the_tables_order():
    names = callback_names(run_of("fit"))
    assert names == [
        "training_plan",
        "initial_weights_record",
        "run_continuity",
        "stop_on_signal",
        "random_states",
        "plateau_step_on_resume",
        "loader_position_on_resume",
        "best_checkpoint",
        "last_checkpoint",
        "lr_monitor",
        "early_stopping",
        "mlflow_model",
        "data_inputs",
        "data_content",
        "system_metrics",
        "confusion_matrix",
        "epoch_summary",
        "loop_doctor",
    ]
    assert names[0] == "training_plan"  # the plan prints before the epoch lines
    assert names[-1] == "loop_doctor"  # its batch timer counts the other callbacks' batch hooks as compute
    grouped = recipe_callbacks(run_of("fit"))
    # what Lightning finds by type stands alone; the rest, the callbacks with checkpoint state and the doctor (last)
    # included, is one group where its first member stands, so Lightning's per-callback cost of every hook is paid 4
    # times, not 18 (issue 32: RandomStates, PlateauStepOnResume and LoopDoctor moved into the group)
    assert [type(c).__name__ for c in grouped] == [
        "CallbackGroup", "RunCheckpoint", "RunCheckpoint", "RecipeEarlyStopping",
    ]
    assert [type(c).__name__ for c in grouped[0].members] == [
        "TrainingPlan", "InitialWeightsRecord", "RunContinuity", "StopOnSignal", "RandomStates", "PlateauStepOnResume",
        "LoaderPositionOnResume", "LearningRateMonitor", "MlflowModel", "DataInputs", "DataContent", "SystemMetrics",
        "ConfusionMatrixArtifact", "EpochSummary", "LoopDoctor",
    ]
    built = [c for c in grouped if not isinstance(c, CallbackGroup)]
    assert [type(c).__name__ for c in flat(grouped)] == [
        "TrainingPlan",
        "InitialWeightsRecord",
        "RunContinuity",
        "StopOnSignal",
        "RandomStates",
        "PlateauStepOnResume",
        "LoaderPositionOnResume",
        "LearningRateMonitor",
        "MlflowModel",
        "DataInputs",
        "DataContent",
        "SystemMetrics",
        "ConfusionMatrixArtifact",
        "EpochSummary",
        "LoopDoctor",
        "RunCheckpoint",
        "RunCheckpoint",
        "RecipeEarlyStopping",
    ]
    assert [c.alias for c in built if type(c).__name__ == "RunCheckpoint"] == ["best", "last"]
    assert built[0].monitor == "val/acc" and built[0].mode == "max"
    assert built[2].patience == 5


@pytest.mark.parametrize(
    "stage, overrides, expected",
    [
        ("fit", {"tracked": False, "early_stopping_patience": None, "interactive": True}, None),
        ("validate", {}, ["stop_evaluation_on_signal", "data_inputs", "data_content", "system_metrics",
                          "confusion_matrix", "epoch_summary"]),
        ("test", {"interactive": True}, ["stop_evaluation_on_signal", "data_inputs", "data_content", "system_metrics",
                                         "confusion_matrix"]),
        ("predict", {"system_metrics_interval": 0.0}, ["stop_evaluation_on_signal", "data_inputs", "data_content",
                                                       "predictions", "epoch_summary"]),
    ],
)
def test_conditions_and_stages_select_rows(stage, overrides, expected):
    names = callback_names(run_of(stage, **overrides))
    if expected is None:  # fit without a logger, a patience or a non-terminal stdout
        assert "lr_monitor" not in names and "early_stopping" not in names and "epoch_summary" not in names
        assert names[0] == "training_plan" and names[-1] == "loop_doctor"
    else:
        assert names == expected


def test_checkpoint_every_n_steps_adds_a_second_writer_of_last_ckpt():
    names = callback_names(run_of("fit", checkpoint_every_n_steps=50))
    assert names[names.index("last_checkpoint") + 1] == "step_checkpoint"
    built = [c for c in recipe_callbacks(run_of("fit", checkpoint_every_n_steps=50)) if type(c).__name__ == "RunCheckpoint"]
    assert [(c.alias, c.every_n_steps) for c in built] == [("best", None), ("last", None), ("last", 50)]
    assert len({c.state_key for c in built}) == 3  # Lightning keeps each one's state apart


def test_every_row_says_why_it_stands_there():
    assert all(slot.why_here for slot in RECIPE_CALLBACKS)
    assert len({slot.name for slot in RECIPE_CALLBACKS}) == len(RECIPE_CALLBACKS)


def test_the_trainer_of_a_recipe_gets_them_in_that_order(workdir, monkeypatch):
    seen = []
    original = RecipesCLI.instantiate_trainer

    def record(self, **kwargs):
        trainer = original(self, **kwargs)
        seen.extend(type(c).__name__ for c in flat(trainer.callbacks))
        return trainer

    monkeypatch.setattr(RecipesCLI, "instantiate_trainer", record)
    cli.main(["fit", "-c", str(SPIRAL), "--trainer.fast_dev_run", "1"])
    ours = [name for name in seen if name not in ("ModelSummary", "RichModelSummary", "TQDMProgressBar", "RichProgressBar")]
    # fast_dev_run builds no logger (no LR monitor); Lightning moves checkpoint callbacks after all others
    assert ours == [
        "TrainingPlan",
        "InitialWeightsRecord",
        "RunContinuity",
        "StopOnSignal",
        "RandomStates",
        "PlateauStepOnResume",
        "LoaderPositionOnResume",
        "DataContent",
        "ConfusionMatrixArtifact",
        "EpochSummary",
        "LoopDoctor",
        "RunCheckpoint",
        "RunCheckpoint",
    ]


def test_a_group_calls_each_hook_on_the_members_that_define_it_in_order():
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback

    calls = []

    class First(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            calls.append(("first", batch_idx))

        def setup(self, trainer, pl_module, stage):
            calls.append(("first setup", stage))

    class Second(Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            calls.append(("second", batch_idx))

        def on_train_end(self, trainer, pl_module):
            calls.append(("second end", trainer.global_step))

    class Stateful(Callback):
        def state_dict(self):
            return {"x": 1}

    group = CallbackGroup([First(), Second()])
    assert group.hook_calls["on_train_batch_end"] and not group.hook_calls["on_validation_end"]
    from lightning.pytorch.demos.boring_classes import BoringModel

    trainer = pl.Trainer(max_steps=2, callbacks=[group], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(BoringModel())
    assert calls == [("first setup", "fit"), ("first", 0), ("second", 0), ("first", 1), ("second", 1),
                     ("second end", 2)]
    # members may keep checkpoint state (issue 32: under their own state_key), but not two under one key
    assert CallbackGroup([First(), Stateful()]).stateful
    with pytest.raises(ValueError, match="more than one member keeps checkpoint state under .*Stateful"):
        CallbackGroup([Stateful(), First(), Stateful()])


def test_lightning_calls_only_the_batch_hooks_that_do_something_and_every_hook_of_the_users_callbacks(
    workdir, monkeypatch
):
    # issue 32: Lightning calls every batch hook of every callback inside a profiler context (~3 us apiece, six per
    # training step per callback, whether the hook does anything or not); the recipe's and Lightning's own callbacks
    # skip the ones that do nothing, a user's callback is called as Lightning always calls it
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.profilers import PassThroughProfiler

    from recipes.compat.internals import BATCH_HOOKS

    class Recording(PassThroughProfiler):
        actions: list[str] = []

        def start(self, action_name: str) -> None:
            Recording.actions.append(action_name)

    class UsersCallback(Callback):  # overrides none of the batch hooks
        pass

    users = UsersCallback()
    original = RecipesCLI.instantiate_trainer

    def with_recording_profiler(self, **kwargs):
        self.config_init[self.subcommand]["trainer"]["callbacks"] = [users]
        trainer = original(self, **kwargs)
        trainer.profiler = Recording()
        return trainer

    monkeypatch.setattr(RecipesCLI, "instantiate_trainer", with_recording_profiler)
    cli.main(["fit", "-c", str(SPIRAL), "--trainer.max_steps", "3", "--trainer.limit_val_batches", "2",
              "--checkpoint_every_n_steps", "2"])
    called: dict[str, set[str]] = {}
    for action in Recording.actions:
        owner, _, hook = action.rpartition(".")
        if action.startswith("[Callback]") and hook in BATCH_HOOKS:
            name = owner.removeprefix("[Callback]").split("{")[0].split("[")[0].rpartition(".")[2]
            called.setdefault(name, set()).add(hook)
    train_hooks = {"on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                   "on_before_zero_grad", "on_train_batch_end"}
    assert called.pop("UsersCallback") == train_hooks | {"on_validation_batch_start", "on_validation_batch_end"}
    # the group: its members' own (the loop doctor's step checks, batch timer and mode check, the signal stop, ...)
    assert called.pop("CallbackGroup") == {"on_train_batch_start", "on_before_backward", "on_before_optimizer_step",
                                           "on_train_batch_end", "on_validation_batch_start",
                                           "on_validation_batch_end"}
    # the writer of last.ckpt every 2 steps checks its trigger after each batch; the other checkpoint never does
    assert called.pop("RunCheckpoint") == {"on_train_batch_end"}
    assert called == {}  # RunRecord, the model summary, PlateauStep, early stopping: no batch hook is called
    steps = [a for a in Recording.actions if a.endswith(".on_train_batch_end") and "RunCheckpoint" in a]
    assert len(steps) == 3  # one of the two checkpoints, at each of the 3 steps
