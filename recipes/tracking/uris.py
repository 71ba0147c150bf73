"""Where a recipe's runs are tracked: the tracking URI (``MLFLOW_TRACKING_URI`` or ``./mlflow.db``; a PostgreSQL or
MySQL URL with the driver that is installed, ``recipes.tracking.database_urls``) and the check that a tracking server
or database answers before anything runs."""

from __future__ import annotations

import os
from pathlib import Path

from recipes.tracking.database_urls import (
    DatabaseUnavailable,
    check_database,
    is_database_url,
    masked_url,
    refuse_ambiguous_credentials,
    with_installed_driver,
)
from recipes.tracking.hidden_passwords import remember_password
from recipes.tracking.server_ready import wait_until_server_ready
from recipes.tracking.failures import is_server_uri, short_reason

class TrackingServerUnreachable(ConnectionError):
    """The MLflow tracking server or database named by the tracking URI does not answer (or has no driver here)."""


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set (read now, not at import; ``postgresql://``/``mysql://`` naming the driver that
    is installed, ``with_installed_driver``), else ``sqlite:///<cwd>/mlflow.db``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return with_installed_driver(uri)
    return f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def check_tracking_server(uri: str) -> None:
    """For a server URI, ask the server for one experiment (no retries, a few seconds at most); for a PostgreSQL or
    MySQL URL, connect once (``database_urls.check_database``: the driver installed, the database answers, the login
    accepted).

    Raises ``TrackingServerUnreachable`` naming the URI (its password masked) and the reason when it does not answer,
    so a recipe stops before training instead of failing (or hanging in retries) at its first logging call. Local
    stores (SQLite, file) are not checked: MLflow creates them. A URL whose user name or password cannot be read
    unambiguously is refused first (``AmbiguousCredentials``, a ``ValueError``), naming no part of them.
    """
    remember_password(uri)
    refuse_ambiguous_credentials(uri, "tracking URI")
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
    from requests.exceptions import RequestException  # noqa: PLC0415

    try:
        wait_until_server_ready(uri)  # /health, then the API: a server still starting is waited for (server_ready.py)
    except (MlflowException, RequestException, OSError) as err:
        raise TrackingServerUnreachable(
            f"the MLflow tracking server at {masked_url(uri)} does not answer ({short_reason(err)}); start it "
            "(`mlflow server --host 127.0.0.1 --port <port> ...`), fix MLFLOW_TRACKING_URI / trainer.logger.init_args."
            "tracking_uri, or unset it to track in ./mlflow.db"
        ) from None
