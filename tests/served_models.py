"""A real `mlflow models serve --env-manager local` of a logged model, for the end-to-end tests of served models."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

from tests.conftest import REPO, free_port


@contextmanager
def served_model(directory: Path, model_uri: str) -> Iterator[int]:
    """Serve ``model_uri`` of the embedded store in ``directory`` on a free port of 127.0.0.1 (yielded) until the
    block ends; fails with the server's stderr when it does not answer /ping within 180 s."""
    port = free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{directory / 'mlflow.db'}",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           # MLflow starts `uvicorn` by name: the interpreter's own scripts first, whether the venv is activated or not
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port)],
        cwd=directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the server did not start: {server.stderr.read().decode()[-2000:]}")
                time.sleep(1)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


def invoke(port: int, frame: pd.DataFrame) -> tuple[int, dict[str, Any]]:
    """POST ``frame`` (``dataframe_split``) to the served model's /invocations: (HTTP status, JSON body)."""
    body = json.dumps({"dataframe_split": json.loads(frame.to_json(orient="split", index=False))}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/invocations", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
