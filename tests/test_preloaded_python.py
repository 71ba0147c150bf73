"""``tests/preloaded_python.py``: a forked process behaves as ``python -c``/``python -m`` would, for what the tests
that use it rely on (exit status, signals, streams, working directory, environment, ``sys.argv``/``sys.path``, the
interpreter's exit), and the ``LIBRARIES`` server's processes start with nothing of loopwise imported."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, recipes_env
from tests.preloaded_python import LIBRARIES, RECIPES, _Server, preloaded_popen, preloaded_run

EXIT = """
import atexit, os, sys, threading, time
atexit.register(lambda: print("atexit ran", flush=True))
threading.Thread(target=lambda: (time.sleep(0.3), print("thread joined", flush=True))).start()
print(os.getcwd(), os.environ["PRELOADED_PROBE"], sys.argv[1:], sys.path[0] == "", file=sys.stderr)
print("out", flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("code", [0, 3])
def test_exit_code_streams_cwd_environment_argv_threads_and_atexit(tmp_path, code):
    env = {**recipes_env(), "PRELOADED_PROBE": "yes"}
    out = preloaded_run([sys.executable, "-c", EXIT, str(code), "b"], cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == code
    assert out.stdout.splitlines() == ["out", "thread joined", "atexit ran"]  # non-daemon thread first, as at exit
    assert out.stderr.strip() == f"{tmp_path} yes ['{code}', 'b'] True"


def test_uncaught_exception_and_the_signals_that_end_a_process():
    env = recipes_env()
    raised = preloaded_run([sys.executable, "-c", "raise ValueError('boom')"], cwd=REPO, env=env, timeout=60)
    assert raised.returncode == 1 and raised.stderr.strip().endswith("ValueError: boom")
    killed = preloaded_run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
                           cwd=REPO, env=env, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    for signum, returncode in ((signal.SIGINT, -signal.SIGINT), (signal.SIGTERM, -signal.SIGTERM)):
        process = preloaded_popen([sys.executable, "-u", "-c", "import time; print('up'); time.sleep(60)"], cwd=REPO,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with process:
            assert process.stdout is not None and process.stdout.readline().strip() == "up"
            assert process.poll() is None
            process.send_signal(signum)
            assert process.wait(timeout=30) == returncode
            if signum == signal.SIGINT:  # Python's default handler: KeyboardInterrupt, then death by SIGINT
                assert process.stderr is not None and "KeyboardInterrupt" in process.stderr.read()
        process.send_signal(signal.SIGTERM)  # after the end: nothing, as subprocess does


def test_python_m_runs_the_module_as_main_with_its_arguments(tmp_path):
    (tmp_path / "probe_module.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    env = {**recipes_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    out = preloaded_run([sys.executable, "-m", "probe_module", "x", "--y"], cwd=REPO, env=env, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "__main__ ['x', '--y']")


def test_a_process_of_the_libraries_server_has_imported_nothing_of_loopwise():
    code = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('recipes', 'lightning_modules', 'datamodules')), 'lightning' in sys.modules)")
    out = preloaded_run([sys.executable, "-c", code], cwd=REPO, env=recipes_env(), timeout=60, preload=LIBRARIES)
    assert (out.returncode, out.stdout.strip()) == (0, "[] True")


def test_a_forked_process_has_the_libraries_and_the_recipes_imported_before_its_code_runs():
    """The reason for the module: the process does not pay the imports again (seconds of CPU each time)."""
    code = "import sys; print(all(m in sys.modules for m in ('lightning.pytorch', 'mlflow', 'recipes.cli')))"
    out = preloaded_run([sys.executable, "-c", code], cwd=REPO, env=recipes_env(), timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "True")


RANK_PROBE = """
import os, sys
from lightning.fabric.utilities.rank_zero import rank_zero_only
print(os.getppid(), os.getcwd(), rank_zero_only.rank, sys.argv[1:], flush=True)
sys.exit(3)
"""

LAUNCHER = """
import os, subprocess, sys
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.strategies.launchers import subprocess_script
env = {**os.environ, "LOCAL_RANK": "1"}
print(os.getppid(), rank_zero_only.rank, flush=True)
rank = subprocess_script.subprocess.Popen([sys.executable, "-m", "rank_probe", "--x"], env=env, cwd=sys.argv[1])
print("child", rank.wait(timeout=60), rank.poll(), flush=True)
assert subprocess_script.subprocess.PIPE is subprocess.PIPE  # everything else is the subprocess module
"""


def test_a_rank_that_lightnings_launcher_starts_is_forked_from_the_server_with_its_rank_read_again(tmp_path):
    """Lightning's DDP launcher starts rank 1 with ``subprocess.Popen([python, -m, ...], env=..., cwd=...)``: from a
    forked process it is forked from the same server (a sibling, not a fresh interpreter), with that environment and
    working directory, its output on the launcher's, its exit status through ``wait``/``poll``, and the rank Lightning
    reads from the environment at import (``LOCAL_RANK=1``) read again."""
    (tmp_path / "rank_probe.py").write_text(RANK_PROBE)
    env = {**recipes_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    out = preloaded_run([sys.executable, "-c", LAUNCHER, str(tmp_path)], cwd=REPO, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    launcher, rank, ended = out.stdout.splitlines()
    server, launcher_rank = launcher.split()
    assert launcher_rank == "0"
    assert rank.split(maxsplit=3) == [server, str(tmp_path), "1", "['--x']"]  # forked by the server, as rank 0 was
    assert ended == "child 3 3"


TORCHRUN_PROBE = """
import os
print(os.getppid(), os.getsid(0) == os.getpid(), os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"], flush=True)
"""


def test_a_worker_that_torchrun_starts_is_forked_from_the_server_in_a_session_of_its_own(tmp_path):
    """torch's elastic agent starts a worker with ``Popen([python, -u, -m, ...], start_new_session=True)`` and ends a
    late one with ``os.killpg``: a torchrun forked from the server forks its worker there too, leading its own
    session."""
    (tmp_path / "torchrun_probe.py").write_text(TORCHRUN_PROBE)
    env = {**recipes_env(), "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    with preloaded_popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m",
                          "torchrun_probe"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE) as torchrun:
        out, err = torchrun.communicate(timeout=120)
    assert torchrun.returncode == 0, err
    (line,) = [line for line in out.splitlines() if line.strip()]
    parent, leads_session, local_rank, world_size = line.split()
    assert (leads_session, local_rank, world_size) == ("True", "0", "1")
    assert int(parent) == _Server.started[(RECIPES, ())][0].pid  # not torchrun's child: forked by the server, as torchrun was
