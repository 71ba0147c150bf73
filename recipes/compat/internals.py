"""The one place in ``recipes`` that touches private names of Lightning (and of its MLflow logger).

Every name below is private (a leading underscore) in the library that owns it and may change in any release. The
recipes' callbacks, logger and CLI call the small functions of this module instead (``tests/test_structure.py``
fails when a private name appears anywhere else), and ``tests/lightning_modules/test_compat.py`` probes each one
against the installed versions: after an upgrade, a failing probe names the function here to update, instead of a
silent change of behaviour in the middle of a training run. ``lightning_modules`` and ``datamodules`` never import
it: the modules people import use Lightning's public API only.

``PRIVATE_NAMES`` lists what each function relies on, for the probes and for the audit of an upgrade.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar, Union

from lightning.pytorch.callbacks import Callback

from lightning_modules.init_args import add_missing_init_args

CallbackT = TypeVar("CallbackT", bound=Callback)

# Lightning's ``_PATH`` (lightning.fabric.utilities.types): what a CheckpointIO accepts as a path
CheckpointPath = Union[str, Path]

PRIVATE_NAMES: dict[str, str] = {
    "stop_after_this_batch": "Trainer._signal_connector.received_sigterm",
    "can_stop_after_this_batch": "Trainer._signal_connector",
    "hold_stop_request": "Trainer._signal_connector.received_sigterm",
    "is_logging_step": "Trainer._logger_connector.should_update_logs",
    "time_train_fetches": "fit_loop.epoch_loop._on_before_fetch / _on_after_fetch (profiler hooks around a fetch)",
    "strategy_checkpoint_io_is_set": "Strategy._checkpoint_io",
    "saved_train_loader_states": "checkpoint['loops']['fit_loop']['state_dict']['combined_loader'] (written by "
    "FitLoop.on_save_checkpoint, read back by FitLoop._load_combined_loader_states)",
    "SubcommandErrorHook": "LightningCLI._run_subcommand",
    "mlflow_logger_*": "MLFlowLogger._initialized, _log_model, _checkpoint_callback, _logged_model_time, "
    "_experiment_name",
    "checkpoint_state_key": "Callback._generate_state_key",
    "skip_batch_hooks": "trainer.call._call_callback_hooks (skips a hook attribute that is not callable, before its "
    "profiler context and state_key; the batch hooks reach callbacks through it only)",
    "ConfigDumpWithInitArgs": "LightningCLI._dump_config (reuses config_dump when set) and cli._set_dict_nested "
    "(writes instantiation-link values into <class>.init_args of the dump)",
    "keep_hyperparameters_from_loggers": "HyperparametersMixin._log_hyperparams (what save_hyperparameters(logger=) "
    "set; Lightning's _log_hyperparams reads it at the start of a run)",
}


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


def is_logging_step(trainer: Any) -> bool:
    """Whether the training batch in progress is one whose step-level values Lightning writes to the loggers (every
    ``log_every_n_steps`` optimizer steps, when the run is stopping, and every step of ``fast_dev_run``). The same
    answer from ``on_train_batch_start`` through ``on_train_batch_end`` of that batch."""
    return bool(trainer._logger_connector.should_update_logs) or bool(trainer.fast_dev_run)


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
def keep_hyperparameters_from_loggers(module: Any) -> None:
    """Stop Lightning from sending ``module``'s saved hyperparameters to the trainer's loggers at the start of a run
    (as ``save_hyperparameters(logger=False)`` does): a recipe logs its whole config itself."""
    module._log_hyperparams = False


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
    "BATCH_HOOKS",
    "can_stop_after_this_batch",
    "checkpoint_state_key",
    "CheckpointPath",
    "ConfigDumpWithInitArgs",
    "hold_stop_request",
    "is_logging_step",
    "keep_hyperparameters_from_loggers",
    "mlflow_logger_experiment_name",
    "mlflow_logger_forget_checkpoints",
    "mlflow_logger_log_model",
    "mlflow_logger_run_created",
    "mlflow_logger_uploaded_files",
    "PRIVATE_NAMES",
    "saved_train_loader_states",
    "skip_batch_hooks",
    "stop_after_this_batch",
    "strategy_checkpoint_io_is_set",
    "SubcommandErrorHook",
    "time_train_fetches",
    "untime_train_fetches",
]
