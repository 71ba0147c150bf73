"""Where a recipe's runs are tracked: the tracking URI (``MLFLOW_TRACKING_URI`` or ``./mlflow.db``; a PostgreSQL or
MySQL URL with the driver that is installed, ``recipes.tracking.database_urls``) and the check that a tracking server
or database answers before anything runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recipes.tracking.database_urls import DatabaseUnavailable, check_database, is_database_url, with_installed_driver
from recipes.tracking.failures import fast_http_failures, is_server_uri, short_reason

SERVER_CHECK_TIMEOUT_S = 5


class TrackingServerUnreachable(ConnectionError):
    """The MLflow tracking server or database named by the tracking URI does not answer (or has no driver here)."""


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set (read now, not at import; ``postgresql://``/``mysql://`` naming the driver that
    is installed, ``with_installed_driver``), else ``sqlite:///<cwd>/mlflow.db``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return with_installed_driver(uri)
    return f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


@contextmanager
def mlflow_settings_kept() -> Iterator[None]:
    """MLflow's process-wide settings as they were before the block: its global tracking URI and every ``MLFLOW_*``
    environment variable. Lightning's ``MLFlowLogger`` calls ``mlflow.set_tracking_uri`` with the run's store when it
    opens the run, and MLflow exports that as ``MLFLOW_TRACKING_URI``; a recipe also sets MLflow's asynchronous-
    logging and progress-bar variables. Kept for the run (the recipe's own calls need them), they would outlive it:
    the next recipe in the same process (a notebook, a script that calls ``recipes.cli.main`` twice) would read that
    URI as the user's and log into the first run's store. Each command puts them back when it ends."""
    import mlflow  # noqa: PLC0415

    environment = {key: value for key, value in os.environ.items() if key.startswith("MLFLOW_")}
    global_uri = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    try:
        yield
    finally:
        mlflow.set_tracking_uri(global_uri)  # exports (or removes) MLFLOW_TRACKING_URI: the environment comes next
        for key in [key for key in os.environ if key.startswith("MLFLOW_")]:
            if key not in environment:
                del os.environ[key]
        os.environ.update(environment)


def check_tracking_server(uri: str) -> None:
    """For a server URI, ask the server for one experiment (no retries, a few seconds at most); for a PostgreSQL or
    MySQL URL, connect once (``database_urls.check_database``: the driver installed, the database answers, the login
    accepted).

    Raises ``TrackingServerUnreachable`` naming the URI (its password masked) and the reason when it does not answer,
    so a recipe stops before training instead of failing (or hanging in retries) at its first logging call. Local
    stores (SQLite, file) are not checked: MLflow creates them.
    """
    if is_database_url(uri):
        try:
            check_database(uri, "tracking store")
        except DatabaseUnavailable as err:
            raise TrackingServerUnreachable(f"{err}; the URL is MLFLOW_TRACKING_URI or trainer.logger.init_args."
                                            "tracking_uri (unset, runs are tracked in ./mlflow.db)") from None
        return
    if not is_server_uri(uri):
        return
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415
    from requests.exceptions import RequestException  # noqa: PLC0415

    try:
        with fast_http_failures(uri, retries=0, timeout_s=SERVER_CHECK_TIMEOUT_S):
            MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except (MlflowException, RequestException, OSError) as err:
        raise TrackingServerUnreachable(
            f"the MLflow tracking server at {uri} does not answer ({short_reason(err)}); start it (`mlflow server --host "
            "127.0.0.1 --port <port> ...`), fix MLFLOW_TRACKING_URI / trainer.logger.init_args.tracking_uri, or "
            "unset it to track in ./mlflow.db"
        ) from None
