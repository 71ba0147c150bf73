"""What the ``recipes`` command may ask of a task: the one written contract between the recipes and a task.

A recipe's task is any ``LightningModule``. The loopwise tasks (``lightning_modules.Task`` and its subclasses)
implement all of this contract; your own task implements what it wants of it, by name, with no base class to
derive from: each member below is a small ``typing.Protocol`` (runtime checkable), and the recipes read a member
only through the function next to it, which gives the documented default to a task without it. A plain
``LightningModule`` that implements none of it trains, evaluates and predicts in a recipe as it is.

Members (what, when the recipes ask, default without it):

* ``monitor``, ``monitor_mode`` (``MonitoredTask``, ``MonitorMode``): the metric that defines "best" and its
  direction, read when a run's callbacks are built (checkpoints, early stopping). Default ``val/loss``, ``min``.
* ``default_monitor`` on the class (``DefaultMonitor``): the monitor when the config names none, read by ``recipes
  sweep`` (the objective) and ``recipes compare`` (the metric of a run's ``config.yaml``). Default ``val/loss``.
* ``data_mismatch(datamodule)`` on the class (``ChecksData``): why the task cannot learn from that data, read
  before the task is built. Default: no objection.
* ``model`` (``HasNetwork``): the network, whose class is the run's ``network`` param. Default: the task itself.
* ``schedule`` (``HasSchedule``): a ``Schedule`` (its class and ``describe()`` are the run's ``schedule`` params,
  its ``resolved_warmup_steps`` the plan's warmup). Default: none.
* ``configured_schedule()`` (``DescribesSchedule``): the schedule behind the LR scheduler, checked by the loop
  doctor's ``schedule`` check. Default: none.
* ``expected_initial_loss()`` and ``explain_expected_initial_loss(expected)`` (``ExpectsInitialLoss``,
  ``ExplainsInitialLoss``): the first batch's loss a fresh network should have, and its wording, for the loop
  doctor's ``initial_loss`` check. Default: ln(num_classes) for a ``MulticlassTask`` (``task == "multiclass"``
  and an int ``num_classes``), else no check.
* ``clipping_measures_gradient_norm()`` and ``gradient_norm`` (``MeasuresGradientNorm``): the task measures the
  total gradient norm while clipping, so the loop doctor reads it instead of measuring again (asked before each
  optimizer step). Default: the doctor measures.
* ``fine_tuning`` (``FineTunedTask``): a ``FineTuning`` (initial weights, freeze schedule), read for the training
  plan's parameter phases and the ``trainable_parameters`` metric. Default: one phase from ``requires_grad``.
* ``load_initial_weights(path)`` and ``weights_report`` (``LoadsInitialWeights``): load ``init_from`` when a run
  starts (a tracked run's checkpoint fetched first) and report what was loaded (``init_from.json``). Default: none.
* ``prediction_columns(outputs, datamodule)`` (``PredictionColumns``): readable columns of the predictions CSV and
  of the MLflow model's output. Default: ``output_0..k``.
* ``train_loss_steps`` (``ChoosesTrainLossSteps``): which training batches log ``train/loss``, set by ``recipes fit``
  to the steps whose values it reads (the loggers' steps, the epoch's last batch). Default: left as the task logs.
* ``last_confusion_matrix`` (``ConfusionMatrices``): per stage, the confusion matrix of the last val/test epoch,
  logged as a figure. Default: no figure.

Lightning's own members (``hparams``, ``strict_loading``) are read as Lightning defines them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

from torch import Tensor, nn

from lightning_modules.fine_tuning.initial_weights import WeightsReport
from lightning_modules.fine_tuning.settings import FineTuning
from lightning_modules.optim.schedules import Schedule

DEFAULT_MONITOR = "val/loss"
DEFAULT_MONITOR_MODE: Literal["min", "max"] = "min"


@runtime_checkable
class MonitoredTask(Protocol):
    """``monitor``: the metric that defines "best" for the checkpoints and early stopping, read when the run's
    callbacks are built; default ``val/loss``."""

    monitor: str


@runtime_checkable
class MonitorMode(Protocol):
    """``monitor_mode``: the direction of ``monitor`` ("min" or "max"); default ``min``."""

    monitor_mode: Literal["min", "max"]


@runtime_checkable
class DefaultMonitor(Protocol):
    """``default_monitor`` (a class attribute): the monitor of a task whose config names none. Read from the class
    by ``recipes sweep`` and ``recipes compare``; default ``val/loss``."""

    default_monitor: str


@runtime_checkable
class ChecksData(Protocol):
    """``data_mismatch(datamodule)`` (a classmethod): why this task cannot learn from the data module's kind of
    target, or ``None``. Asked of the task's class before it is built; default ``None``."""

    def data_mismatch(self, datamodule: Any) -> str | None: ...


@runtime_checkable
class HasNetwork(Protocol):
    """``model``: the task's network (its class is the run's ``network`` param); default: the task itself."""

    model: nn.Module


@runtime_checkable
class HasSchedule(Protocol):
    """``schedule``: the task's learning-rate ``Schedule`` (the run's ``schedule`` params and the training plan's
    warmup); default: none."""

    schedule: Schedule


@runtime_checkable
class DescribesSchedule(Protocol):
    """``configured_schedule()``: the ``Schedule`` behind the scheduler ``configure_optimizers`` returns, or
    ``None``; the loop doctor's ``schedule`` check reads its ``interval`` before training. Default ``None``."""

    def configured_schedule(self) -> Schedule | None: ...


@runtime_checkable
class ExpectsInitialLoss(Protocol):
    """``expected_initial_loss()``: the loss a freshly initialized network should have on its first batch, or
    ``None`` for no check (the loop doctor's ``initial_loss`` check, on the first batch of a fresh fit)."""

    def expected_initial_loss(self) -> float | None: ...


@runtime_checkable
class ExplainsInitialLoss(Protocol):
    """``explain_expected_initial_loss(expected)``: how the doctor's message words ``expected``; default
    "<value> expected at initialization"."""

    def explain_expected_initial_loss(self, expected: float) -> str: ...


@runtime_checkable
class MulticlassTask(Protocol):
    """``task`` and ``num_classes``: a task without ``expected_initial_loss`` whose ``task`` is "multiclass" and
    whose ``num_classes`` is an int is expected to start at ln(num_classes)."""

    task: str
    num_classes: int


@runtime_checkable
class MeasuresGradientNorm(Protocol):
    """``clipping_measures_gradient_norm()``: whether the coming optimizer step's clipping measures the total
    gradient norm, kept in ``gradient_norm`` after the step (asked by the loop doctor before each optimizer step,
    so keep it cheap). Default: the doctor measures the norm itself."""

    gradient_norm: Tensor | None

    def clipping_measures_gradient_norm(self) -> bool: ...


@runtime_checkable
class ChoosesTrainLossSteps(Protocol):
    """``train_loss_steps``: a function of the trainer saying which training batches log ``train/loss`` (``None``:
    every batch). ``recipes fit`` sets it to the steps whose values it reads. Default: the task logs as it logs."""

    train_loss_steps: Callable[[Any], bool] | None


@runtime_checkable
class FineTunedTask(Protocol):
    """``fine_tuning``: the task's ``FineTuning`` (its ``phases()`` are the training plan's parameter counts, its
    ``describe()`` the run's fine-tuning params, its ``freeze_schedule`` the ``trainable_parameters`` metric)."""

    fine_tuning: FineTuning


@runtime_checkable
class LoadsInitialWeights(Protocol):
    """``load_initial_weights(path)``: load ``init_from`` now (``path``: the local copy of a tracked run's
    checkpoint), returning the report; ``weights_report``: what the load did (``None`` before). Called right after
    the task is built, for a command that restores no checkpoint; default: no initial weights."""

    weights_report: WeightsReport | None

    def load_initial_weights(self, path: str | None = None) -> WeightsReport | None: ...


@runtime_checkable
class PredictionColumns(Protocol):
    """``prediction_columns(outputs, datamodule)``: readable columns of all samples' outputs (``prediction``,
    ``prob_<class>``), or ``None``; ``recipes predict`` and the MLflow model write them. Default ``output_0..k``."""

    def prediction_columns(self, outputs: Tensor, datamodule: Any = None) -> dict[str, list[Any]] | None: ...


@runtime_checkable
class ConfusionMatrices(Protocol):
    """``last_confusion_matrix``: per stage ("val", "test"), the confusion matrix of the last epoch; logged as a
    figure after fit, validate and test. Default: no figure."""

    last_confusion_matrix: dict[str, Tensor]


# --- what the recipes call: one function per member, with its default ---------------------------------------------
def monitor_of(task: Any) -> str:
    """The task's ``monitor`` (default ``val/loss``)."""
    return task.monitor if isinstance(task, MonitoredTask) else DEFAULT_MONITOR


def monitor_mode_of(task: Any) -> Literal["min", "max"]:
    """The task's ``monitor_mode`` (default ``min``)."""
    return task.monitor_mode if isinstance(task, MonitorMode) else DEFAULT_MONITOR_MODE


def default_monitor_of(task_class: Any, default: str | None = DEFAULT_MONITOR) -> str | None:
    """The ``default_monitor`` of a task class (``default`` without one)."""
    return task_class.default_monitor if isinstance(task_class, DefaultMonitor) else default


def data_mismatch_of(task_class: Any, datamodule: Any) -> str | None:
    """Why the task class cannot learn from ``datamodule`` (``None``: it can, or it does not say)."""
    return task_class.data_mismatch(datamodule) if isinstance(task_class, ChecksData) else None


def network_of(task: Any) -> Any:
    """The task's network (default: the task itself)."""
    return task.model if isinstance(task, HasNetwork) else task


def schedule_of(task: Any) -> Any:
    """The task's ``schedule`` (default ``None``)."""
    return task.schedule if isinstance(task, HasSchedule) else None


def configured_schedule_of(task: Any) -> Schedule | None:
    """The task's ``configured_schedule()`` (default ``None``)."""
    return task.configured_schedule() if isinstance(task, DescribesSchedule) else None


def fine_tuning_of(task: Any) -> FineTuning | None:
    """The task's ``fine_tuning`` (default ``None``)."""
    return task.fine_tuning if isinstance(task, FineTunedTask) else None


def weights_report_of(task: Any) -> WeightsReport | None:
    """The task's ``weights_report`` (default ``None``)."""
    return task.weights_report if isinstance(task, LoadsInitialWeights) else None


def prediction_columns_of(task: Any, outputs: Tensor, datamodule: Any) -> dict[str, list[Any]] | None:
    """The task's ``prediction_columns(outputs, datamodule)`` (default ``None``: raw outputs)."""
    return task.prediction_columns(outputs, datamodule) if isinstance(task, PredictionColumns) else None


def confusion_matrices_of(task: Any) -> dict[str, Tensor] | None:
    """The task's ``last_confusion_matrix`` (default ``None``)."""
    return task.last_confusion_matrix if isinstance(task, ConfusionMatrices) else None


def log_train_loss_on(task: Any, steps: Callable[[Any], bool]) -> None:
    """Have the task log ``train/loss`` only on the training batches ``steps(trainer)`` accepts, where it lets the
    recipes choose (``train_loss_steps``); a task without it is left as it is."""
    if isinstance(task, ChoosesTrainLossSteps):
        task.train_loss_steps = steps


_MEASURES_NORM: dict[type, bool] = {}


def measures_gradient_norm(task: Any) -> bool:
    """Whether the task implements ``MeasuresGradientNorm``: decided once per class (asked every optimizer step;
    ``gradient_norm`` is set in ``__init__``, as ``Task`` does)."""
    implements = _MEASURES_NORM.get(type(task))
    if implements is None:
        implements = _MEASURES_NORM.setdefault(type(task), isinstance(task, MeasuresGradientNorm))
    return implements


def clipping_measures_gradient_norm(task: Any) -> bool:
    """The task's ``clipping_measures_gradient_norm()`` (default ``False``)."""
    return measures_gradient_norm(task) and bool(task.clipping_measures_gradient_norm())


def measured_gradient_norm(task: Any) -> Tensor | None:
    """The ``gradient_norm`` the task's clipping measured (default ``None``)."""
    return task.gradient_norm if measures_gradient_norm(task) else None


__all__ = [
    "ChecksData", "ChoosesTrainLossSteps", "ConfusionMatrices", "DefaultMonitor", "DescribesSchedule", "ExpectsInitialLoss",
    "ExplainsInitialLoss", "FineTunedTask", "HasNetwork", "HasSchedule", "LoadsInitialWeights", "MeasuresGradientNorm",
    "MonitorMode", "MonitoredTask", "MulticlassTask", "PredictionColumns", "clipping_measures_gradient_norm",
    "configured_schedule_of", "confusion_matrices_of", "data_mismatch_of", "default_monitor_of", "fine_tuning_of",
    "measured_gradient_norm", "measures_gradient_norm", "monitor_mode_of", "monitor_of", "network_of",
    "log_train_loss_on", "prediction_columns_of", "schedule_of", "weights_report_of",
]
