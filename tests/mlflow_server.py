"""A real ``mlflow server`` for the tests that stop a tracker in the middle of a run: on 127.0.0.1 with a fixed port,
a SQLite backend store and a local artifact root, so it can be killed (SIGKILL, its whole process group) and started
again on the same port and store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port


class MlflowServer:
    """``mlflow server`` in ``root`` (``server.db``, ``artifacts/``, ``server.log``) on a free port of 127.0.0.1;
    ``backend_store_uri``: another backend store (a PostgreSQL database) instead of ``server.db``."""

    def __init__(self, root: Path, backend_store_uri: str | None = None) -> None:
        self.root, self.port, self.proc = root, free_port(), None
        self.backend_store_uri = backend_store_uri or f"sqlite:///{root / 'server.db'}"
        self.uri = f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 180) -> None:
        """Start it and wait until ``/health`` answers."""
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        mlflow = Path(sys.executable).with_name("mlflow")
        command = [str(mlflow)] if mlflow.exists() else [sys.executable, "-m", "mlflow"]
        log = (self.root / "server.log").open("a")
        self.proc = subprocess.Popen(
            [*command, "server", "--backend-store-uri", self.backend_store_uri,
             "--artifacts-destination", str(self.root / "artifacts"),
             "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
            cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server did not start:\n{(self.root / 'server.log').read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        """Kill it (SIGKILL to its process group: the port refuses connections at once)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(20)


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory):
    """An ``MlflowServer`` started for the test (a module imports this fixture by name), killed after it."""
    srv = MlflowServer(tmp_path_factory.mktemp("server"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
