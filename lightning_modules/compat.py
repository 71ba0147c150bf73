"""The one place where loopwise touches private names of Lightning and torch.

Every name below is private (a leading underscore) in the library that owns it and may change in any release. Code
elsewhere in ``lightning_modules``, ``datamodules``, ``recipes`` and ``benchmarks`` calls the small functions of
this module instead (``tests/test_structure.py`` fails when a private name appears anywhere else), and
``tests/lightning_modules/test_compat.py`` probes each one against the installed versions: after an upgrade, a failing probe names the
function here to update, instead of a silent change of behaviour in the middle of a training run.

It lives in ``lightning_modules`` because that is the package every other one may import (``recipes`` imports it,
``lightning_modules`` itself needs it); it imports Lightning and torch only, never MLflow.

``PRIVATE_NAMES`` lists what each function relies on, for the probes and for the audit of an upgrade.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, TypeVar, Union

import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

from lightning_modules.init_args import add_missing_init_args

try:  # set by LightningCLI while it instantiates a module from a config (Lightning >= 2.3)
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters as _GIVEN_HYPERPARAMETERS
except ImportError:  # pragma: no cover - another Lightning without it: modules count as built in Python
    _GIVEN_HYPERPARAMETERS = None

CallbackT = TypeVar("CallbackT", bound=Callback)

# Lightning's ``_PATH`` (lightning.fabric.utilities.types): what a CheckpointIO accepts as a path
CheckpointPath = Union[str, Path]

# torch's common base of BatchNorm*d, InstanceNorm*d and SyncBatchNorm (``nn.modules.batchnorm._NormBase``)
BATCH_AND_INSTANCE_NORM: type[nn.Module] = nn.modules.batchnorm._NormBase

PRIVATE_NAMES: dict[str, str] = {
    "built_from_config": "lightning.pytorch.core.mixins.hparams_mixin._given_hyperparameters (a ContextVar)",
    "is_compiled_in_place": "torch.nn.Module._compiled_call_impl (set by Module.compile())",
    "attached_trainer": "LightningModule._trainer",
    "optimizer_has_stepped": "torch.optim.Optimizer._opt_called (set by the step wrapper of an LR scheduler)",
    "BATCH_AND_INSTANCE_NORM": "torch.nn.modules.batchnorm._NormBase",
    "stop_after_this_batch": "Trainer._signal_connector.received_sigterm",
    "can_stop_after_this_batch": "Trainer._signal_connector",
    "hold_stop_request": "Trainer._signal_connector.received_sigterm",
    "epoch_batches_done": "fit_loop.epoch_loop._num_ready_batches_reached()",
    "is_logging_step": "Trainer._logger_connector.should_update_logs",
    "step_metrics_step": "fit_loop._should_accumulate(), fit_loop.epoch_loop._batches_that_stepped (the step "
    "_LoggerConnector.log_metrics writes a batch's step-level metrics at)",
    "show_step_value": "Trainer._logger_connector._callback_metrics, _logged_metrics, _progress_bar_metrics",
    "time_train_fetches": "fit_loop.epoch_loop._on_before_fetch / _on_after_fetch (profiler hooks around a fetch)",
    "strategy_checkpoint_io_is_set": "Strategy._checkpoint_io",
    "saved_train_loader_states": "checkpoint['loops']['fit_loop']['state_dict']['combined_loader'] (written by "
    "FitLoop.on_save_checkpoint, read back by FitLoop._load_combined_loader_states)",
    "SubcommandErrorHook": "LightningCLI._run_subcommand",
    "keep_hyperparameters_from_loggers": "HyperparametersMixin._log_hyperparams (what save_hyperparameters(logger=) "
    "set; Lightning's _log_hyperparams reads it at the start of a run)",
    "mlflow_logger_*": "MLFlowLogger._initialized, _log_model, _checkpoint_callback, _logged_model_time, "
    "_log_batch_kwargs, _experiment_name",
    "checkpoint_state_key": "Callback._generate_state_key",
    "skip_batch_hooks": "trainer.call._call_callback_hooks (skips a hook attribute that is not callable, before its "
    "profiler context and state_key; the batch hooks reach callbacks through it only)",
    "remember_data_hook_owners": "Trainer._data_connector._datahook_selector (a _DataHookSelector, made per run by "
    "attach_data; its get_instance is asked for every batch)",
    "relog_held_metrics": "LightningModule._current_fx_name, Trainer._results (a _ResultCollection: its keys "
    "'<hook>.<name>[.<dataloader_idx>]', dataloader_idx, update_metrics) and _ResultMetric.value, .meta, .has_reset",
    "QuickHookNameWrites": "LightningModule._current_fx_name (a plain attribute Lightning sets and restores around "
    "every hook it calls)",
    "ConfigDumpWithInitArgs": "LightningCLI._dump_config (reuses config_dump when set) and cli._set_dict_nested "
    "(writes instantiation-link values into <class>.init_args of the dump)",
}


# --- lightning_modules ----------------------------------------------------------------------------------------
def built_from_config() -> bool:
    """Whether LightningCLI is instantiating a module from a parsed config right now (then the module's
    hyperparameters are the config: class paths and plain values that ``load_from_checkpoint`` can rebuild)."""
    return _GIVEN_HYPERPARAMETERS is not None and _GIVEN_HYPERPARAMETERS.get() is not None


def given_hyperparameters_var() -> contextvars.ContextVar | None:
    """Lightning's context variable behind ``built_from_config`` (``None`` where this Lightning has none)."""
    return _GIVEN_HYPERPARAMETERS


def is_compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module.compile()`` (in place, parameter names unchanged) has been called on ``module``."""
    return getattr(module, "_compiled_call_impl", None) is not None


def attached_trainer(module: Any) -> Any | None:
    """The Trainer a LightningModule is attached to, or ``None`` (``module.trainer`` raises when there is none)."""
    return module._trainer


def remember_data_hook_owners(trainer: Any) -> None:
    """Make Lightning decide once per run, not at every batch, whether the data module or the LightningModule runs
    each batch-transfer hook (``on_before_batch_transfer``, ``transfer_batch_to_device``, ``on_after_batch_transfer``).

    Lightning asks its ``_DataHookSelector.get_instance`` for each of the three hooks of every batch, each answer two
    ``is_overridden`` calls when a data module is attached (some sixty calls a step). The selector is made anew for
    each ``fit``/``validate``/``test``/``predict``: the task's ``setup`` calls this each time. A trainer without a
    selector is left alone."""
    selector = getattr(getattr(trainer, "_data_connector", None), "_datahook_selector", None)
    if selector is None or hasattr(vars(selector).get("get_instance"), "cache_info"):
        return
    selector.get_instance = functools.lru_cache(maxsize=None)(selector.get_instance)


def relog_held_metrics(module: Any, metrics: Iterable[tuple[str, Any]]) -> bool:
    """Do what ``self.log(name, metric, on_step=False, on_epoch=True, ...)`` does for torchmetrics ``Metric`` objects
    that Lightning already holds from the same call in an earlier epoch, and say whether it did.

    A ``Metric`` handed to ``self.log`` stays with Lightning, which computes and resets it at the epoch's end; the next
    epoch's call only marks it logged again (``_ResultCollection.update_metrics``), after validating the value,
    building and comparing the call's metadata and moving the entry to the value's device (a deep copy of that
    metadata and a ``Metric.to``): about 0.7 ms per metric on a CPU, for a submodule already on the module's device.

    Returns ``False``, and does nothing, unless every ``(name, metric)`` is held under the hook being run now with that
    very ``Metric`` object, logged once an epoch (``on_step=False, on_epoch=True``), and not yet logged this epoch: the
    caller then calls ``self.log`` as usual (the first epoch, a new metric object, other options)."""
    results, fx = getattr(attached_trainer(module), "_results", None), getattr(module, "_current_fx_name", None)
    if results is None or fx is None:
        return False
    suffix = "" if results.dataloader_idx is None else f".{results.dataloader_idx}"
    held = []
    for name, metric in metrics:
        entry = results.get(f"{fx}.{name}{suffix}")
        meta = getattr(entry, "meta", None)
        if (entry is None or getattr(entry, "value", None) is not metric or not entry.has_reset or meta is None
                or meta.on_step or not meta.on_epoch or meta.dataloader_idx != results.dataloader_idx):
            return False
        held.append((f"{fx}.{name}{suffix}", metric))
    for key, metric in held:
        results.update_metrics(key, metric, 1)  # a Metric's entry ignores the batch size
    return True


class QuickHookNameWrites:
    """Mixin for a LightningModule (listed before it among the bases): Lightning's writes of the name of the hook it
    is running, and of the ``plain_attributes`` a subclass adds, go straight into the instance's ``__dict__``.

    Lightning sets ``_current_fx_name`` around every module, callback and strategy hook it calls (47 writes a step);
    ``nn.Module.__setattr__`` checks each value against parameters, submodules and buffers (3.8 us a write on a 2-core
    EPYC, a tenth of a spiral MLP's CPU step) before it stores a string, ``None`` or a plain tensor in ``__dict__``, as
    this does at once (0.4 us). Other names and values (a parameter, module, ``nn.Buffer``), a name registered as one,
    and a name a class of the module defines (a property) take the usual path."""

    #: attributes that only ever hold a string, ``None`` or a plain tensor (never a parameter, submodule or buffer)
    plain_attributes: ClassVar[frozenset[str]] = frozenset({"_current_fx_name"})
    _quick_names: ClassVar[frozenset[str]] = plain_attributes

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._quick_names = frozenset(n for n in cls.plain_attributes if not any(n in vars(k) for k in cls.__mro__))

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._quick_names and (value is None or type(value) is str or (
                type(value) is torch.Tensor and not getattr(value, "_is_buffer", False))):
            own = self.__dict__  # and not a name registered as a parameter, buffer or submodule:
            if name not in own.get("_parameters", ()) and name not in own.get("_buffers", ()) and name not in own.get(
                    "_modules", ()):
                own[name] = value
                return
        super().__setattr__(name, value)


def optimizer_has_stepped(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step()`` has run: it holds state, or the step wrapper that an LR scheduler installs has
    counted a call (plain SGD keeps no state)."""
    return bool(optimizer.state) or bool(getattr(optimizer, "_opt_called", False))


# --- the Trainer --------------------------------------------------------------------------------------------------
def can_stop_after_this_batch(trainer: Any) -> bool:
    """Whether this Trainer has the signal connector that ``stop_after_this_batch`` uses."""
    return hasattr(getattr(trainer, "_signal_connector", None), "received_sigterm")


def stop_after_this_batch(trainer: Any) -> None:
    """Make Lightning stop as it does after SIGTERM: it raises ``SIGTERMException`` (on every rank) at the end of the
    current training batch, and ``on_exception`` callbacks run."""
    trainer._signal_connector.received_sigterm = True


def hold_stop_request(trainer: Any) -> bool:
    """Withdraw a pending ``stop_after_this_batch`` (SIGTERM) request and say whether there was one. While it is set,
    Lightning's evaluation loop raises ``SIGTERMException`` after any validation batch but the last."""
    connector = getattr(trainer, "_signal_connector", None)
    if not getattr(connector, "received_sigterm", False):
        return False
    connector.received_sigterm = False
    return True


def epoch_batches_done(trainer: Any) -> bool:
    """Whether the fit loop's epoch loop has fetched ("readied") every batch of the current epoch: true from the
    ``on_train_batch_start`` of the epoch's last batch on, through its end-of-epoch validation."""
    return bool(trainer.fit_loop.epoch_loop._num_ready_batches_reached())


def is_logging_step(trainer: Any) -> bool:
    """Whether the training batch in progress is one whose step-level values Lightning writes to the loggers (every
    ``log_every_n_steps`` optimizer steps, when the run is stopping, and every step of ``fast_dev_run``). The same
    answer from ``on_train_batch_start`` through ``on_train_batch_end`` of that batch."""
    return bool(trainer._logger_connector.should_update_logs) or bool(trainer.fast_dev_run)


def step_metrics_step(trainer: Any) -> int | None:
    """The step at which Lightning writes the step-level metrics of the training batch in progress to the loggers
    (its count of optimizer steps before this one), or ``None`` when it writes none after this batch (not a logging
    step, or a batch that accumulates gradients). The same answer from the training step through the module's
    ``on_train_batch_end``, unless the run is asked to stop in between (then Lightning writes them)."""
    loop = trainer.fit_loop
    if loop._should_accumulate() and trainer.lightning_module.automatic_optimization:
        return None
    return int(loop.epoch_loop._batches_that_stepped) if is_logging_step(trainer) else None


def show_step_value(trainer: Any, name: str, value: torch.Tensor | None = None, bar: float | None = None) -> None:
    """Put a training step's value where ``self.log(name, value, on_step=True, on_epoch=False, prog_bar=True)``
    puts it, without the call's result bookkeeping: ``value`` (a tensor) in the trainer's callback metrics
    (checkpoints, early stopping, the epoch line) and logged metrics, ``bar`` (a number) in its progress-bar
    metrics."""
    connector = trainer._logger_connector
    if value is not None:
        connector._callback_metrics[name] = value
        connector._logged_metrics[name] = value
    if bar is not None:
        connector._progress_bar_metrics[name] = bar


def time_train_fetches(trainer: Any, before: Callable[[], None], after: Callable[[], None]) -> bool:
    """Call ``before()`` just before and ``after()`` just after each fetch of a training batch, around Lightning's own
    hooks there (which the epoch loop reads at every epoch start). Returns ``False``, changing nothing, where this
    Lightning has no such hooks. ``untime_train_fetches`` undoes it."""
    loop = trainer.fit_loop.epoch_loop
    lightning_before = getattr(loop, "_on_before_fetch", None)
    lightning_after = getattr(loop, "_on_after_fetch", None)
    if not (callable(lightning_before) and callable(lightning_after)):
        return False

    def timed_before() -> None:
        before()
        lightning_before()

    def timed_after() -> None:
        lightning_after()
        after()

    loop._on_before_fetch = timed_before  # instance attributes shadow the loop's methods
    loop._on_after_fetch = timed_after
    return True


def untime_train_fetches(trainer: Any) -> None:
    """Undo ``time_train_fetches``: the epoch loop's own fetch hooks again."""
    loop = trainer.fit_loop.epoch_loop
    for name in ("_on_before_fetch", "_on_after_fetch"):
        if name in vars(loop):
            delattr(loop, name)


def saved_train_loader_states(checkpoint: dict[str, Any]) -> list[Any]:
    """The ``state_dict()`` of each stateful train loader (one with ``state_dict``/``load_state_dict``) that Lightning's
    fit loop wrote into ``checkpoint``, in the order of the combined loader's loaders; ``[]`` when it wrote none.

    Lightning gives them back to the loaders only when ``FitLoop.setup_data`` runs after the loops were restored;
    ``trainer.estimated_stepping_batches`` read in ``configure_optimizers`` runs it before (Lightning issue 20550),
    and the states are silently dropped: ``recipes.callbacks.loader_resume`` loads them itself."""
    fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
    return list(fit_loop.get("state_dict", {}).get("combined_loader", []))


def strategy_checkpoint_io_is_set(strategy: Any) -> bool:
    """Whether a strategy instance was given its own ``CheckpointIO`` (then a plugin must not replace it)."""
    return getattr(strategy, "_checkpoint_io", None) is not None


# --- callbacks and loggers ---------------------------------------------------------------------------------------
# the hooks Lightning calls on every callback at every batch (six a training step), through ``_call_callback_hooks``
BATCH_HOOKS: tuple[str, ...] = (
    "on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
    "on_before_zero_grad", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end",
)


def skip_batch_hooks(callback: CallbackT, needed: Iterable[str] | None = None) -> CallbackT:
    """Make Lightning skip ``callback``'s batch hooks (``BATCH_HOOKS``) other than ``needed``, and call the ``needed``
    ones again; without ``needed``, skip the ones neither its class nor the instance defines, leave the others as they
    are.

    Lightning calls each hook on each callback inside a profiler context named by the callback's ``state_key`` (about
    3 microseconds a call even when the hook is the base class's no-op: six hooks per training step per callback), and
    skips an attribute that is not callable before any of that. A skipped hook is set to ``None`` on the instance
    (the class is unchanged); call it on loopwise's own callbacks only, whose batch hooks nothing calls directly.
    Returns ``callback``.
    """
    keep = set(needed) if needed is not None else {
        name for name in BATCH_HOOKS if getattr(type(callback), name, None) is not getattr(Callback, name)
    }
    for name in BATCH_HOOKS:
        if name not in keep:
            if needed is None and callable(callback.__dict__.get(name)):
                continue  # a hook set on the instance itself is the callback's own
            callback.__dict__[name] = None
        elif needed is not None:
            callback.__dict__.pop(name, None)
    return callback


def keep_hyperparameters_from_loggers(module: Any) -> None:
    """Stop Lightning from sending ``module``'s saved hyperparameters to the trainer's loggers at the start of a run
    (as ``save_hyperparameters(logger=False)`` does): a recipe logs its whole config itself."""
    module._log_hyperparams = False


def checkpoint_state_key(callback: Any, **identity: Any) -> str:
    """The key under which Lightning stores a callback's state in a checkpoint (class name plus ``identity``)."""
    return callback._generate_state_key(**identity)


def mlflow_logger_run_created(logger: Any) -> bool:
    """Whether Lightning's ``MLFlowLogger`` has created (or attached to) its MLflow run yet."""
    return bool(logger._initialized)


def mlflow_logger_log_model(logger: Any) -> bool | str:
    """The ``log_model`` setting of an ``MLFlowLogger`` (``True``, ``False`` or ``"all"``)."""
    return logger._log_model


def mlflow_logger_experiment_name(logger: Any) -> str:
    """The experiment name an ``MLFlowLogger`` was given ("" if none)."""
    return str(getattr(logger, "_experiment_name", "") or "")


def mlflow_logger_uploaded_files(logger: Any) -> dict[str, Any]:
    """The logger's record of checkpoint files already uploaded (``name -> stamp``), which Lightning consults too."""
    return logger._logged_model_time


def mlflow_logger_forget_checkpoints(logger: Any) -> None:
    """Stop Lightning's ``MLFlowLogger.finalize`` from uploading checkpoints itself (under its own names)."""
    logger._checkpoint_callback = None


@contextmanager
def mlflow_logger_unbuffered(logger: Any) -> Iterator[None]:
    """Within the block, the ``MLFlowLogger`` writes synchronously (no ``synchronous=False`` batching kwargs)."""
    kwargs, logger._log_batch_kwargs = logger._log_batch_kwargs, {}
    try:
        yield
    finally:
        logger._log_batch_kwargs = kwargs


# --- LightningCLI -------------------------------------------------------------------------------------------------
class SubcommandErrorHook:
    """Mixin for a ``LightningCLI`` subclass: an exception raised while a subcommand runs (``fit``, ``test``, ...)
    goes to ``self.on_subcommand_error(subcommand, error)``, which may raise another one or re-raise it."""

    def on_subcommand_error(self, subcommand: str, error: Exception) -> None:
        """Called with the exception a subcommand raised; the default re-raises it."""
        raise error

    def _run_subcommand(self, subcommand: str) -> None:
        try:
            super()._run_subcommand(subcommand)  # type: ignore[misc]
        except Exception as err:  # noqa: BLE001  (the hook decides)
            self.on_subcommand_error(subcommand, err)


class ConfigDumpWithInitArgs:
    """Mixin for a ``LightningCLI`` subclass: a network whose every argument is a linked size (``TinyNet(num_classes)``)
    can be built.

    Lightning writes the values of instantiation links into the module's hyperparameters at
    ``<class>.init_args.<name>`` of its config dump, and fails ("Expected key model.init_args.num_classes to be in
    data") where jsonargparse's dump left out a class's ``init_args`` because all of them are link targets. This
    mixin makes the dump once, as Lightning does, with an empty ``init_args`` beside every ``class_path`` lacking one.
    """

    def _dump_config(self) -> None:
        if not hasattr(self, "config_dump"):
            super()._dump_config()  # type: ignore[misc]
            add_missing_init_args(self.config_dump)  # type: ignore[attr-defined]


__all__ = [
    "attached_trainer", "BATCH_AND_INSTANCE_NORM", "BATCH_HOOKS", "built_from_config", "can_stop_after_this_batch",
    "checkpoint_state_key", "CheckpointPath", "ConfigDumpWithInitArgs", "epoch_batches_done", "hold_stop_request",
    "is_compiled_in_place", "keep_hyperparameters_from_loggers", "mlflow_logger_experiment_name", "mlflow_logger_forget_checkpoints",
    "mlflow_logger_log_model", "mlflow_logger_run_created", "mlflow_logger_unbuffered",
    "mlflow_logger_uploaded_files", "optimizer_has_stepped", "PRIVATE_NAMES", "QuickHookNameWrites",
    "saved_train_loader_states", "show_step_value", "skip_batch_hooks", "step_metrics_step", "stop_after_this_batch",
    "strategy_checkpoint_io_is_set", "SubcommandErrorHook", "time_train_fetches", "untime_train_fetches",
]
