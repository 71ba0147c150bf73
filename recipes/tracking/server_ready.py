"""Waiting for a tracking server that is still starting: ``/health`` first, then its API, for a bounded time.

A server just started (``mlflow server ...``) answers ``GET /health`` as soon as its web process runs, while its API
may not answer for some seconds more (its backend store being opened or migrated, its workers starting); the first
command run right after it used to fail ("does not answer") at its one 5 s probe. ``wait_until_server_ready`` asks
the way the server becomes ready: ``/health``, then one API call (a search for one experiment), and while
``/health`` answers 200 and the API does not, asks again every second for up to ``LOOPWISE_SERVER_WAIT_S`` seconds
(default ``DEFAULT_SERVER_WAIT_S`` = 30: a server's first migrations of a new SQLite or PostgreSQL store take
seconds, not minutes; a wait longer than that is a server in trouble), saying so in one line on stderr. A server
whose ``/health`` does not answer 200 (nothing listens on the port, a wrong URL, a proxy without ``/health``) gets
the one API probe and its answer at once, as before; so does an answer that waiting cannot change (a refused login).
"""

from __future__ import annotations

import os
import sys
import time

from recipes.tracking.database_urls import masked_url
from recipes.tracking.failures import fast_http_failures, is_server_uri, short_reason

SERVER_WAIT_ENV = "LOOPWISE_SERVER_WAIT_S"
DEFAULT_SERVER_WAIT_S = 30.0
PROBE_TIMEOUT_S = 5  # one probe (``/health`` or the API call) waits at most this long for its answer
PROBE_INTERVAL_S = 1.0


def server_wait_s() -> float:
    """The longest wait for a starting server's API: ``LOOPWISE_SERVER_WAIT_S`` seconds (a number >= 0), else 30 (a
    value that is not such a number is one warning line, and the default is used: every command reads it, and none
    should stop over it)."""
    text = os.environ.get(SERVER_WAIT_ENV, "").strip()
    if not text:
        return DEFAULT_SERVER_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        print(f"recipes: warning: {SERVER_WAIT_ENV}={text!r} is not a number of seconds >= 0; a starting tracking "
              f"server is waited for up to {DEFAULT_SERVER_WAIT_S:g} s (set it to a number, or unset it)",
              file=sys.stderr, flush=True)
        return DEFAULT_SERVER_WAIT_S
    return value


def health_answers(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether ``GET <uri>/health`` answers 200 (the server's web process runs); ``False`` on any other answer or
    none."""
    import requests  # noqa: PLC0415

    try:
        return requests.get(f"{uri.rstrip('/')}/health", timeout=timeout_s).status_code == 200
    except requests.RequestException:
        return False


def final_answer(err: BaseException) -> bool:
    """Whether the API's failure is an answer that waiting cannot change: a 4xx status (a refused login, a path that
    is no MLflow API) other than 408 (timeout) and 429 (too many requests)."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    if not isinstance(err, MlflowException):
        return False
    status = err.get_http_status_code()
    return 400 <= status < 500 and status not in (408, 429)


def wait_until_server_ready(uri: str, timeout_s: float | None = None) -> None:
    """Return once the MLflow tracking server at ``uri`` answers its API (one search for an experiment); a server
    whose ``/health`` answers 200 while its API does not yet is asked again every second for up to ``timeout_s``
    seconds (default ``server_wait_s()``: ``LOOPWISE_SERVER_WAIT_S``, else 30), with one line on stderr saying so.

    Raises the API call's last failure (``MlflowException``, ``requests.RequestException`` or ``OSError``: the
    caller words it) when the server is not ready in time, at once when ``/health`` does not answer 200 or the API's
    answer is one waiting cannot change (``final_answer``). Nothing for a URI that is not a server's (``http(s)://``).
    """
    if not is_server_uri(uri):
        return
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415
    from requests.exceptions import RequestException  # noqa: PLC0415

    wait_s = server_wait_s() if timeout_s is None else timeout_s
    deadline, said = time.monotonic() + wait_s, False
    while True:
        healthy = health_answers(uri)
        try:
            with fast_http_failures(uri, retries=0, timeout_s=PROBE_TIMEOUT_S):
                MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
            return
        except (MlflowException, RequestException, OSError) as err:
            left = deadline - time.monotonic()
            if not healthy or left <= 0 or final_answer(err):
                raise
            if not said:
                print(f"recipes: waiting for the MLflow tracking server at {masked_url(uri)}: /health answers, its "
                      f"API does not yet ({short_reason(err)}); up to {wait_s:g} s ({SERVER_WAIT_ENV} sets how long)",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(min(PROBE_INTERVAL_S, left))


__all__ = ["DEFAULT_SERVER_WAIT_S", "SERVER_WAIT_ENV", "server_wait_s", "wait_until_server_ready"]
