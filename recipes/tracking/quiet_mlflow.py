"""MLflow output a recipe user cannot act on, silenced only around the loopwise call that makes MLflow print it.

MLflow reports routine steps on its loggers at INFO: a new store's tables created, the system-metrics monitor started
and stopped (and that it skips GPU metrics on a machine without one), the model's input example validated. When
loopwise logs the model, MLflow also warns about a choice loopwise made for the user (an integer column in the
inferred signature: the class index among the outputs, or an input column the model's own check covers) and draws a
progress bar while it copies the checkpoint into the model folder. (Its "Add type hints to the `predict` method" is
answered at the cause: ``pyfunc_model.py``'s ``predict`` takes a ``pd.DataFrame``.)

Each is silenced by logger and message (INFO records only) or by category, message and MLflow's module, inside the
call that causes it: ``quiet_info`` for a logger's records, ``quiet_model_logging`` for the model. The same output
from anywhere else (the user's own MLflow calls, the user's code), and every other record and warning, still prints.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

#: the INFO lines of MLflow's store while it creates the tables of a new database (``create_database_atomically``)
STORE_CREATION = ("mlflow.store.db.utils", ("Creating initial MLflow database tables", "Updating database tables"))
#: the INFO lines of MLflow's system-metrics monitor when ``SystemMetrics`` builds, starts and stops it
SYSTEM_METRICS_MONITOR = (
    "mlflow.system_metrics.system_metrics_monitor",
    ("Skip logging GPU metrics", "Started monitoring system metrics", "Stopping system metrics monitoring",
     "Successfully terminated system metrics monitoring"),
)
#: the INFO line of MLflow's pyfunc flavour when it checks the input example against the signature
EXAMPLE_VALIDATION = ("mlflow.pyfunc", ("Validating input example against model signature",))
#: (category, message pattern, module pattern) of MLflow's warnings while loopwise logs the model
MODEL_LOGGING_WARNINGS = (
    (UserWarning, r"Hint: Inferred schema contains integer column", r"mlflow\.types\.utils"),
)
PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
#: MLflow's switch for the "View run ... at: <url>" and "View experiment at: <url>" lines it writes to stdout when a
#: run against a tracking server ends (``TrackingServiceClient._log_url``)
RUN_LINKS = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"


class DropInfo(logging.Filter):
    """Drops the records of INFO level or below whose message starts with one of ``messages``; every other record,
    warnings and errors included, passes."""

    def __init__(self, messages: tuple[str, ...]) -> None:
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not record.getMessage().startswith(self.messages)


@contextmanager
def quiet_info(logger_name: str, messages: tuple[str, ...]) -> Iterator[None]:
    """Within the block, the INFO records of the logger ``logger_name`` that start with one of ``messages`` are
    dropped (``DropInfo`` on that logger, removed after)."""
    logger = logging.getLogger(logger_name)
    drop = DropInfo(messages)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextmanager
def env_unless_set(name: str, value: str) -> Iterator[None]:
    """Within the block, the environment variable ``name`` is ``value`` unless the user set it (then it is left as
    it is); removed after."""
    ours = name not in os.environ
    if ours:
        os.environ[name] = value
    try:
        yield
    finally:
        if ours:
            os.environ.pop(name, None)


def no_progress_bar() -> AbstractContextManager[None]:
    """MLflow's artifact progress bar off within the block (``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR=false``), unless
    the user set the variable."""
    return env_unless_set(PROGRESS_BAR, "false")


def no_run_links() -> AbstractContextManager[None]:
    """Within the block (a ``recipes`` command), MLflow writes no "View run ... at" / "View experiment at" lines to
    stdout when a run against a server ends (``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=true``), unless the user set
    the variable: ``recipes compare`` lists the runs, and stdout stays the command's own."""
    return env_unless_set(RUN_LINKS, "true")


@contextmanager
def quiet_model_logging() -> Iterator[None]:
    """Around loopwise's own calls that infer the model's signature and save the pyfunc model: MLflow's warning about
    integer columns in the signature (``MODEL_LOGGING_WARNINGS``), its input-example line and the progress bar of the
    checkpoint's copy are silenced; a warning the model's code raises still prints."""
    with ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        for category, message, module in MODEL_LOGGING_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category, module=module)
        stack.enter_context(quiet_info(*EXAMPLE_VALIDATION))
        stack.enter_context(no_progress_bar())
        yield


__all__ = [
    "EXAMPLE_VALIDATION",
    "MODEL_LOGGING_WARNINGS",
    "RUN_LINKS",
    "STORE_CREATION",
    "SYSTEM_METRICS_MONITOR",
    "DropInfo",
    "env_unless_set",
    "no_progress_bar",
    "no_run_links",
    "quiet_info",
    "quiet_model_logging",
]
