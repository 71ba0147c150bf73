"""Shared fixtures and helpers of the test suite (every test module imports helpers from here, never from another
test module).

- ``workdir``: the test's own working directory with no ``MLFLOW_TRACKING_URI`` (runs land in ./mlflow.db, ./mlruns,
  ./checkpoints), holding a copy of an already-migrated empty store; ``clean_workdir`` does the same for a
  module-scoped fit (``with clean_workdir("name") as directory: main([...])``), restoring the working directory and
  the tracking URI after. Creating MLflow's SQLite tables costs seconds; copying a store at head costs milliseconds,
  and MLflow does not migrate a database that is already at head.
- ``@pytest.mark.fresh_store``: the test's working directory starts with no ``mlflow.db`` (tests of the store's first
  start, of a missing or an old store); ``clean_workdir(name, store=False)`` for a module-scoped one.
- one torch thread in every test (autouse ``one_thread``): the suite runs on 2 xdist workers on 2 cores.
- ``recipes_env()`` and ``two_process_command()``: the environment and command line of a recipe run in a subprocess;
  ``tests/preloaded_python.py`` (``preloaded_run``/``preloaded_popen``) forks such a process from a Python that has
  imported the libraries once, instead of paying a fresh interpreter's imports.
- ``postgres``: one real PostgreSQL server for the session (``tests/postgres_server.py``), shared by the modules that
  use it.
- ``--dist loadfile`` scheduling: every test module runs whole on one worker (its module-scoped fits are made once);
  the heaviest process-spawning modules (``HEAVY_MODULES``) are one unit, so two of them never run at once.
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest

from tests.postgres_server import postgres  # noqa: F401 (the session's PostgreSQL server fixture)

# nothing in the tests reaches the Hugging Face hub: a tokenizer or model name that is not a local directory is looked
# up in the local cache only (read when huggingface_hub is imported, so set before any test module imports it)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
# Every recipe sets torch_threads: 2, and the suite runs 2 xdist workers (plus the processes of DDP and signal
# tests) on 2 cores: more busy threads than cores. torch's OpenMP threads (libgomp) spin while they wait for each
# other, and a spinning thread holds a core the other worker needs: measured here, a 2-thread transformer step loop
# took 32-36 s beside a busy worker with the default policy and 8.5 s with PASSIVE (threads sleep while they wait).
# The wait policy changes no result (the work is split the same way). libgomp reads it when torch is first imported,
# so it is set here, before any test module imports torch; the subprocesses the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SPIRAL = CONFIGS / "spiral_mlp.yaml"


STORE = "mlflow.db"
# set by a DDP launcher; a child that inherits LOCAL_RANK believes its processes were created externally
LAUNCHER_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK")
DDP = CONFIGS / "trainer" / "ddp.yaml"
# the process-spawning modules that load both cores for minutes: one worker runs them one after the other
HEAVY_MODULES = frozenset({
    "tests/end_to_end/test_ddp.py",
    "tests/end_to_end/test_ddp_evaluation.py",
    "tests/end_to_end/test_multi_node.py",
    "tests/end_to_end/test_kill_9_trials.py",
    "tests/end_to_end/test_tracker_outage.py",
    "tests/end_to_end/test_tracking_server.py",
    "tests/end_to_end/test_concurrent_runs.py",
    "tests/end_to_end/test_tracker_outage_recovery.py",
})

# the units that take longest (``--durations=0`` of a full run, 2 workers: minutes each), handed out first
LONGEST_FIRST = (
    "heavy",
    "tests/run/test_recipes_text.py",
    "tests/run/test_cli.py",
    "tests/run/test_recipes.py",
    "tests/tracking/test_store_first_start.py",
    "tests/checkpoints/test_exact_resume.py",
    "tests/tracking/test_record_branches.py",
    "tests/tracking/test_tracker_durability.py",
    "tests/end_to_end/test_postgres.py",
    "tests/checkpoints/test_resume.py",
    "tests/sweep/test_sweep.py",
    "tests/run/test_torch_threads.py",
    "tests/tracking/test_sync_merge.py",
    "tests/predict/test_logged_model.py",
    "tests/checkpoints/test_best_in_store.py",
    "tests/checkpoints/test_resume_elsewhere.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 - xdist's Scheduling
    """``--dist loadfile`` (the addopts) with the heavy modules as one unit: each test module runs whole on one worker
    (its module-scoped fits made once), and one worker runs the heavy modules one after the other. (xdist's own
    ``loadgroup`` cannot group here: it renames test ids, which pytest 9 no longer allows.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesWithHeavyTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "heavy" if module in HEAVY_MODULES else module

        def _assign_work_unit(self, node) -> None:  # noqa: ANN001
            # the longest units first, so that the other worker fills in beside them and no long one is left last
            for scope in reversed(LONGEST_FIRST):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ModulesWithHeavyTogether(config, log)


@pytest.fixture(scope="session")
def migrated_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow SQLite store at head, created once per session (per xdist worker) by MLflow's own client."""
    from mlflow.tracking import MlflowClient

    path = tmp_path_factory.mktemp("migrated_store") / STORE
    MlflowClient(f"sqlite:///{path}").search_experiments(max_results=1)  # creates and migrates every table
    return path


def copy_migrated_store(template: Path, directory: Path) -> Path:
    """``directory/mlflow.db`` as a copy of ``template`` (nothing if a store is there already); the Default
    experiment's artifact location names ``directory/mlruns/0``, as in a store created in ``directory``."""
    target = Path(directory) / STORE
    if target.exists():
        return target
    shutil.copyfile(template, target)
    connection = sqlite3.connect(target)
    try:
        with connection:
            connection.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                               (str(Path(directory).resolve() / "mlruns" / "0"),))
    finally:
        connection.close()
    return target


@contextmanager
def working_directory(directory: Path, store: Path | None = None) -> Iterator[Path]:
    """``directory`` as the working directory with no ``MLFLOW_TRACKING_URI`` (and a copy of the migrated ``store``
    when given); the working directory and the URI (MLflow exports the one it used) are restored after."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        if store is not None:
            copy_migrated_store(store, directory)
        yield Path(directory)


@pytest.fixture(scope="session")
def clean_workdir(tmp_path_factory: pytest.TempPathFactory,
                  migrated_store: Path) -> Callable[..., AbstractContextManager[Path]]:
    """For module-scoped fits: ``with clean_workdir("name") as directory: main([...])`` runs in a new directory with
    the embedded MLflow default and a migrated store (``store=False``: none, MLflow creates it)."""

    def enter(name: str, *, store: bool = True) -> AbstractContextManager[Path]:
        return working_directory(tmp_path_factory.mktemp(name), migrated_store if store else None)

    return enter


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Path:
    """The test's own working directory with no MLFLOW_TRACKING_URI: runs land in ./mlflow.db, ./mlruns,
    ./checkpoints; ./mlflow.db is a copy of the migrated store unless the test is marked ``fresh_store``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    if request.node.get_closest_marker("fresh_store") is None:
        copy_migrated_store(request.getfixturevalue("migrated_store"), tmp_path)
    return tmp_path


@pytest.fixture
def built_trainers(monkeypatch: pytest.MonkeyPatch) -> list:
    """The Trainers ``recipes`` commands build during the test, in order, each as ``RecipesCLI.instantiate_trainer``
    returned it (read its callbacks or profiler after the command)."""
    from recipes.run.recipes_cli import RecipesCLI

    trainers: list = []
    original = RecipesCLI.instantiate_trainer

    def record(self, **kwargs):
        trainer = original(self, **kwargs)
        trainers.append(trainer)
        return trainer

    monkeypatch.setattr(RecipesCLI, "instantiate_trainer", record)
    return trainers


@pytest.fixture(scope="module")
def shared_store(clean_workdir: Callable[..., AbstractContextManager[Path]]) -> Path:
    """One embedded MLflow store for the fast tests (a copy of the migrated one); each test makes its own runs."""
    with clean_workdir("resume_store") as directory:
        runs_of(directory, "spiral_mlp")
    return directory


@pytest.fixture
def store(shared_store: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shared store as working directory (MLflow sets MLFLOW_TRACKING_URI in-process: cleared after)."""
    monkeypatch.chdir(shared_store)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return shared_store


@pytest.fixture(scope="module")
def reference(clean_workdir: Callable[..., AbstractContextManager[Path]]) -> dict:
    """The uninterrupted tabular run of the exact-resume tests: its last checkpoint and its logged values."""
    from tests.exact_resume_runs import reference_run

    with clean_workdir("reference") as directory:
        return reference_run(directory)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch intra-op thread in every test, restored after (a recipe's fit sets its own ``torch_threads``): the
    suite runs on 2 xdist workers on 2 cores, and tiny models on two threads per worker wait on each other."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def recipes_env() -> dict[str, str]:
    """This environment without a tracking URI or a launcher's variables, with the repository importable: for a
    recipe run in a subprocess."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV and k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    return env


def two_process_command(directory: Path, subcommand: str, recipe: Path, *extra: str) -> list[str]:
    """`python -m recipes <subcommand> -c <recipe> -c ddp.yaml` on 2 CPU processes (``data`` linked into
    ``directory``: recipes name their data relative to the repository root)."""
    if (REPO / "data").is_dir() and not (directory / "data").exists():
        (directory / "data").symlink_to(REPO / "data")
    args = [subcommand, "-c", str(recipe), "-c", str(DDP), "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    return [sys.executable, "-m", "recipes", *args, *extra]


def on_two_processes(directory: Path, subcommand: str, recipe: Path, *extra: str) -> subprocess.CompletedProcess:
    """`python -m recipes <subcommand> -c <recipe> -c ddp.yaml ...` on 2 CPU processes in ``directory``: rank 0 forked
    from the preloaded Python (``tests/preloaded_python.py``), rank 1 started by Lightning's launcher from rank 0's
    command line, forked from the same preloaded Python."""
    from tests.preloaded_python import preloaded_run

    # a deadlock between the ranks fails the test instead of hanging CI
    out = preloaded_run(two_process_command(directory, subcommand, recipe, *extra), cwd=directory, env=recipes_env(),
                        timeout=420)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return out


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mlflow_client(directory: Path):
    """An MLflow client on the embedded store of ``directory``."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{Path(directory).resolve() / 'mlflow.db'}")


def runs_of(directory: Path, experiment: str) -> list:
    """All runs of ``experiment`` in the embedded store of ``directory``, oldest first."""
    client = mlflow_client(directory)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return list(runs)


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", "ignore::DeprecationWarning"))
