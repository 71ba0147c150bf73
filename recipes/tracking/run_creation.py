"""A tracking store that refuses to create a recipe's run: one line instead of MLflow's traceback.

The start-up check (``recipes.tracking.uris.check_tracking_server``) asks a server for one experiment; a server (or
the proxy in front of it) can answer that and still refuse ``runs/create`` (HTTP 503 while its database is down,
500, 403), which Lightning meets when it first asks the logger for its run. MLflow then raises an ``MlflowException``
whose text quotes the request's URL, the tracking URI's password included, at the end of a traceback of some hundred
lines. ``run_creation_refusal`` words it as one line: which server (its password masked), the HTTP status and the
endpoint, that nothing was trained, and what to do. A read-only SQLite store is ``failures.read_only_at_start``.
"""

from __future__ import annotations

import re

from recipes.tracking.database_urls import masked_url
from recipes.tracking.failures import NO_ANSWER_REASONS, is_server_uri, short_reason

#: the HTTP status in MLflow's words: urllib3's retries used up, or a response MLflow read
HTTP_STATUS = re.compile(r"too many (\d{3}) error responses|error code (\d{3})")
#: the REST endpoint of the refused request (``runs/create``, ``experiments/create``)
ENDPOINT = re.compile(r"/api/[\d.]+/mlflow/([\w/-]+)")


def is_store_error(err: BaseException) -> bool:
    """Whether ``err`` is a tracking store's failure as MLflow raises it (``MlflowException``, or the ``requests``
    or socket error under it), not a failure of the recipe's own code."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415 (mlflow is imported when a run is tracked)
    from requests.exceptions import RequestException  # noqa: PLC0415

    return isinstance(err, (MlflowException, RequestException, ConnectionError))


def run_creation_refusal(uri: str, err: BaseException) -> str:
    """The one line about the store at ``uri`` refusing to create the run (``err``: what MLflow raised), without the
    password: ``the tracking server at http://user:***@host refused to create the run (HTTP 503 to runs/create:
    ...): nothing was trained; ...``."""
    shown = masked_url(uri)
    text = str(err).replace(uri, shown)
    reason = short_reason(text).replace(uri, shown)
    status = HTTP_STATUS.search(text)
    endpoint = ENDPOINT.search(text)
    to = f" to {endpoint.group(1)}" if endpoint else ""
    if status:
        code = f"HTTP {status.group(1) or status.group(2)}{to}: "
    else:
        code = f"{endpoint.group(1)}: " if endpoint else ""
    if not is_server_uri(uri):
        return (
            f"the tracking store {shown} refused to create the run ({code}{reason}): nothing was trained; fix the "
            "store (or point MLFLOW_TRACKING_URI / trainer.logger.init_args.tracking_uri at one that works) and run "
            "the command again"
        )
    refused = "did not answer when asked" if reason in NO_ANSWER_REASONS or "[Errno" in reason else "refused"
    return (
        f"the tracking server at {shown} {refused} to create the run ({code}{reason}): nothing was trained; run the "
        "command again once the server works (its log says why), or unset MLFLOW_TRACKING_URI to track in "
        "./mlflow.db"
    )


__all__ = ["ENDPOINT", "HTTP_STATUS", "is_store_error", "run_creation_refusal"]
