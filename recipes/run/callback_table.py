"""The callbacks every recipe gets, and their order, as data.

``RECIPE_CALLBACKS`` is the table: one row per callback, in the order the trainer receives them, each with the
stages it serves, whether it applies to this run, and why it stands where it does. ``recipe_callbacks`` builds the
rows that apply. (Lightning itself moves checkpoint callbacks after all others, so ``best``/``last`` are saved once
every other callback has seen the validation; the table lists them where the recipe adds them.)

Rows marked ``alone`` go to the Trainer as callbacks of their own: Lightning looks for them by type (checkpoints,
early stopping, the prediction writer) and does not look inside a group. The others, those with checkpoint state
included (the group keeps each member's state under the member's own key), are handed over as one ``CallbackGroup``
where the first of them stands: Lightning calls every hook on every callback, a cost per callback on every training
step (``recipes.callbacks.callback_group``). The loop doctor is the group's last member, after the command's extra
callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from lightning.pytorch.callbacks import Callback, LearningRateMonitor

from recipes.callbacks.callback_group import CallbackGroup
from recipes.callbacks.training_plan import TrainingPlan
from recipes.doctor.loop_doctor import LoopDoctor
from recipes.callbacks.run_checkpoint import RunCheckpoint
from recipes.callbacks.confusion_matrix import ConfusionMatrixArtifact
from recipes.callbacks.data_inputs import DataInputs
from recipes.callbacks.data_content import DataContent
from recipes.callbacks.early_stopping import RecipeEarlyStopping
from recipes.callbacks.stop_evaluation_on_signal import StopEvaluationOnSignal
from recipes.callbacks.initial_weights_record import InitialWeightsRecord
from recipes.callbacks.stop_on_signal import StopOnSignal
from recipes.callbacks.loader_resume import LoaderPositionOnResume
from recipes.callbacks.plateau_resume import PlateauStepOnResume
from recipes.callbacks.mlflow_model import MlflowModel
from recipes.callbacks.prediction_csv_writer import PredictionCsvWriter
from recipes.callbacks.epoch_summary import EpochSummary
from recipes.callbacks.random_states import RandomStates
from recipes.callbacks.system_metrics import SystemMetrics
from recipes.callbacks.run_continuity import RunContinuity


@dataclass(frozen=True)
class RecipeRun:
    """What the callbacks of one recipe run are built from."""

    stage: str  # "fit", "validate", "test" or "predict"
    experiment: str
    checkpoints_dir: str
    monitor: str
    monitor_mode: str
    tracked: bool  # a logger is configured
    early_stopping_patience: int | None = None
    predictions_path: str | None = None
    loop_doctor: dict[str, Any] | None = None  # LoopDoctor's arguments (fit)
    interactive: bool = False  # stdout is a terminal (a progress bar, no epoch lines)
    mlflow_model: bool = True  # log the fitted model as an MLflow pyfunc model
    register_model: str | None = None  # ... and register it under this name
    system_metrics_interval: float = 10.0  # seconds between MLflow system-metric samples; 0: none
    checkpoint_every_n_steps: int | None = None  # last.ckpt also every this many optimizer steps
    resumed_from: str | None = None  # fit: --ckpt_path as the user gave it (named in the line a resumed fit prints)
    data_changes_allowed: bool = False  # evaluation on other data than the checkpoint's, allowed (--allow_data_change)


@dataclass(frozen=True)
class CallbackSlot:
    """One row of the table: a callback, the stages it serves, when it applies and why it stands there."""

    name: str
    stages: tuple[str, ...]
    build: Callable[[RecipeRun], Callback]
    why_here: str
    applies: Callable[[RecipeRun], bool] = lambda run: True
    alone: bool = False  # given to the Trainer on its own, not inside the group
    last: bool = False  # the group's last member, after the command's extra callbacks


def _predictions_path(run: RecipeRun) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return run.predictions_path or f"predictions/{run.experiment}-{stamp}.csv"


FIT = ("fit",)
EVALUATION = ("fit", "validate", "test")

RECIPE_CALLBACKS: tuple[CallbackSlot, ...] = (
    CallbackSlot(
        "training_plan", FIT, lambda run: TrainingPlan(), "first, so the plan prints before the epoch lines"
    ),
    CallbackSlot(
        "initial_weights_record",
        FIT,
        lambda run: InitialWeightsRecord(),
        "what init_from loaded and what was trainable when, in the MLflow run",
    ),
    CallbackSlot("run_continuity", FIT, lambda run: RunContinuity(), "stamps checkpoints with the MLflow run"),
    CallbackSlot("stop_on_signal", FIT, lambda run: StopOnSignal(), "SIGTERM/SIGINT: last.ckpt, run KILLED"),
    CallbackSlot(
        "stop_evaluation_on_signal",
        ("validate", "test", "predict"),
        lambda run: StopEvaluationOnSignal(),
        "SIGTERM/SIGINT during validate/test/predict: stop at once, run KILLED",
    ),
    CallbackSlot(
        "random_states",
        FIT,
        lambda run: RandomStates(),
        "a resumed run draws what an uninterrupted one would (its state in the checkpoint under its own key)",
    ),
    CallbackSlot(
        "plateau_step_on_resume",
        FIT,
        lambda run: PlateauStepOnResume(),
        "the plateau step Lightning skips on resume (its state in the checkpoint under its own key)",
    ),
    CallbackSlot(
        "loader_position_on_resume",
        FIT,
        lambda run: LoaderPositionOnResume(),
        "a mid-epoch resume goes on at the train loader's saved batch (Lightning drops it: issue 20550)",
    ),
    CallbackSlot(
        "best_checkpoint",
        FIT,
        lambda run: RunCheckpoint(
            run.checkpoints_dir, run.experiment, "best", monitor=run.monitor, mode=run.monitor_mode,
            resumed_from=run.resumed_from,
        ),
        "best.ckpt by the task's monitor; a resume keeps the run's best wherever it resumes (and says which)",
        alone=True,
    ),
    CallbackSlot(
        "last_checkpoint",
        FIT,
        lambda run: RunCheckpoint(run.checkpoints_dir, run.experiment, "last"),
        "last.ckpt after every validation; StopOnSignal saves into it",
        alone=True,
    ),
    CallbackSlot(
        "step_checkpoint",
        FIT,
        lambda run: RunCheckpoint(
            run.checkpoints_dir, run.experiment, "last", every_n_steps=run.checkpoint_every_n_steps
        ),
        "last.ckpt also every N optimizer steps (--checkpoint_every_n_steps): a hard kill loses at most N steps",
        applies=lambda run: run.checkpoint_every_n_steps is not None,
        alone=True,
    ),
    CallbackSlot(
        "lr_monitor",
        FIT,
        lambda run: LearningRateMonitor(logging_interval="step"),
        "the LR of every optimizer step, where a logger records it",
        applies=lambda run: run.tracked,
    ),
    CallbackSlot(
        "early_stopping",
        FIT,
        lambda run: RecipeEarlyStopping(
            monitor=run.monitor, mode=run.monitor_mode, patience=run.early_stopping_patience
        ),
        "only where the recipe sets a patience; says why it stopped (stderr line, run tag)",
        applies=lambda run: run.early_stopping_patience is not None,
        alone=True,
    ),
    CallbackSlot(
        "mlflow_model",
        FIT,
        lambda run: MlflowModel(run.register_model),
        "the best checkpoint as an MLflow pyfunc model when a fit finishes (registered with --register_model)",
        applies=lambda run: run.tracked and (run.mlflow_model or run.register_model is not None),
    ),
    CallbackSlot(
        "data_inputs",
        ("fit", "validate", "test", "predict"),
        lambda run: DataInputs(),
        "the splits the command uses as MLflow dataset inputs, with a digest of their content",
        applies=lambda run: run.tracked,
    ),
    CallbackSlot(
        "data_content",
        ("fit", "validate", "test", "predict"),
        lambda run: DataContent(check_splits=not run.data_changes_allowed),
        "the source's and splits' digests in every checkpoint (after data_inputs: its digests are reused); an "
        "evaluated split compared with the checkpoint's",
    ),
    CallbackSlot(
        "system_metrics",
        ("fit", "validate", "test", "predict"),
        lambda run: SystemMetrics(run.system_metrics_interval),
        "MLflow's CPU, memory, disk, network and GPU series for the run, sampled in their own thread",
        applies=lambda run: run.tracked and run.system_metrics_interval > 0,
    ),
    CallbackSlot("confusion_matrix", EVALUATION, lambda run: ConfusionMatrixArtifact(), "a PNG per evaluated split"),
    CallbackSlot(
        "predictions", ("predict",), lambda run: PredictionCsvWriter(_predictions_path(run)), "the CSV", alone=True
    ),
    CallbackSlot(
        "epoch_summary",
        ("fit", "validate", "test", "predict"),
        lambda run: EpochSummary(),
        "one line per epoch where stdout is not a terminal",
        applies=lambda run: not run.interactive,
    ),
    CallbackSlot(
        "loop_doctor",
        FIT,
        lambda run: LoopDoctor(**(run.loop_doctor or {})),
        "last, after the command's extra callbacks: its batch timer then counts the other callbacks' batch hooks "
        "as compute, not as data wait (only the checkpoints, which Lightning calls after every other callback, and "
        "early stopping, which has no batch hooks, come after it)",
        last=True,
    ),
)


def recipe_callbacks(run: RecipeRun, extra: Sequence[Callback] = ()) -> list[Callback]:
    """The callbacks of ``RECIPE_CALLBACKS`` that apply to ``run``, in the table's order; the rows not marked
    ``alone`` as one ``CallbackGroup`` where the first of them stands (a single one as itself).

    ``extra``: callbacks the command adds to the recipe's (``RecipesCLI.extra_callbacks``, e.g. a sweep trial's
    pruning callback); they join the group after the table's grouped rows, before the rows marked ``last`` (their
    checkpoint state, if any, is kept under their own ``state_key``)."""
    built: list[Callback] = []
    group: list[Callback] = []
    last: list[Callback] = []
    for slot in RECIPE_CALLBACKS:
        if run.stage not in slot.stages or not slot.applies(run):
            continue
        callback = slot.build(run)
        if slot.alone:
            built.append(callback)
            continue
        if not group and not last:
            built.append(callback)  # the group's place, filled in below
        (last if slot.last else group).append(callback)
    for callback in extra:
        if not group and not last:
            built.append(callback)  # the group's place, filled in below
        group.append(callback)
    members = group + last
    if len(members) > 1:
        place = next(i for i, c in enumerate(built) if any(c is m for m in members))
        built[place] = CallbackGroup(members)
    return built


def flat(callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with every ``CallbackGroup`` replaced by its members (in the order their hooks run)."""
    return [m for c in callbacks for m in (c.members if isinstance(c, CallbackGroup) else [c])]


def callback_names(run: RecipeRun) -> list[str]:
    """The names of the rows ``recipe_callbacks(run)`` builds, in order (for tests and ``--help`` texts)."""
    return [slot.name for slot in RECIPE_CALLBACKS if run.stage in slot.stages and slot.applies(run)]
