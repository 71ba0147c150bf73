"""An interrupted first start leaves no broken mlflow.db (issue 16, item 3): SIGTERM or Ctrl+C while MLflow creates
its tables used to leave a half-made database that every later command refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import mlflow
import pytest

from recipes.tracking.sqlite_store import prepare_sqlite_store
from tests.conftest import REPO
from tests.preloaded_python import preloaded_popen

CHILD = """
import sys
from recipes.tracking.sqlite_store import prepare_sqlite_store
import mlflow.store.db.utils  # imported before the signal can come: the interruption lands in the creation
print("creating", flush=True)
prepare_sqlite_store(sys.argv[1], "e")
print("done", flush=True)
"""


def interrupted_first_start(directory, signum: int, delay: float) -> str:
    """Start the store's creation in a process and send it ``signum`` ``delay`` s after it began; its last line."""
    uri = f"sqlite:///{directory / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # a process of its own, forked from a Python that has imported MLflow already (tests/preloaded_python.py)
    child = preloaded_popen([sys.executable, "-c", CHILD, uri], cwd=directory, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert child.stdout is not None and child.stdout.readline().strip() == "creating"
    time.sleep(delay)
    child.send_signal(signum)
    rest = child.stdout.read().strip()
    child.wait(timeout=60)
    child.close()
    return rest or "interrupted"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_an_interrupted_first_start_leaves_a_store_the_next_command_can_use(tmp_path, signum):
    outcomes = []
    for n, delay in enumerate((0.0, 0.05, 0.15, 0.3, 0.6, 1.0)):
        directory = tmp_path / f"{signum}-{n}"
        directory.mkdir()
        outcomes.append(interrupted_first_start(directory, signum, delay))
        database = directory / "mlflow.db"
        uri = f"sqlite:///{database}"
        # a half-made database is never left behind: there is none, or a complete one
        prepare_sqlite_store(uri, "e")  # the next command's first step
        client = mlflow.MlflowClient(uri)
        run = client.create_run(client.get_experiment_by_name("e").experiment_id)
        client.log_metric(run.info.run_id, "m", 1.0, step=0)
        client.set_terminated(run.info.run_id)
        assert [m.value for m in client.get_metric_history(run.info.run_id, "m")] == [1.0]
        assert not list(directory.glob(".mlflow.db.*"))  # no temporary file left either
    assert "interrupted" in outcomes  # at least one signal landed during the creation
