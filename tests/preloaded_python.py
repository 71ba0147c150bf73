"""Python processes forked from one that has already imported Lightning, MLflow and the recipes.

A test that runs ``python -m recipes ...`` in a process of its own pays Python's imports every time: about 8 CPU
seconds for Lightning (torch, torch._dynamo, torchmetrics with the transformers and scipy it pulls in) and 2 more for
MLflow, more than the tiny fit the test runs. Most tests start such a process for what happens inside it (a kill at
a chosen moment, a signal, a store deleted under a running fit, two commands at once), not for the interpreter's
start-up; ``preloaded_run`` and ``preloaded_popen`` give them the same process for a fraction of that: a server
process (one per xdist worker, started on first use) imports the libraries once, and every run is a ``fork`` of it.

The forked process is a real process of its own (its own pid, memory, file descriptors, signal dispositions and
exit status): it receives real signals, ``kill -9`` kills it, and it exits with the status the interpreter would
give. Before it runs the command it takes the request's working directory, environment, ``sys.path`` (its
``PYTHONPATH``) and ``sys.argv``, fresh standard streams, and Python's default signal handlers; at the end it does
what the interpreter does at exit (join non-daemon threads, run ``atexit`` functions, flush the streams), then
exits with the code an uncaught ``SystemExit``/exception/``KeyboardInterrupt`` would give.

Two servers: ``RECIPES`` (the libraries and loopwise's recipes, for ``python -m recipes ...``) and ``LIBRARIES`` (the
third-party libraries only), for a process that must start with nothing of loopwise imported: a checkpoint, an
export or an MLflow model loaded "in a fresh process" imports loopwise's modules itself, as a user's process would.

A two-process run forked this way forks its second rank from the same server: in the forked process, Lightning's
DDP launchers (``subprocess_script``) see a ``subprocess`` whose ``Popen`` of ``python -m ...`` is a
``PreloadedProcess`` (the command line, environment and working directory Lightning gives it; its output goes where
rank 0's goes; ``poll``/``send_signal`` work as Lightning's child-process observer uses them). The one thing Lightning
reads from the environment at import, the process's rank (``rank_zero_only.rank``), is read again from the forked
process's environment, as a fresh import would.

So are the workers of a ``torchrun`` forked this way (``test_multi_node.py``): torch's elastic agent starts them with
``Popen(..., start_new_session=True)``, and the forked worker leads a session of its own as that one would.

What it does not reproduce, so the tests of these stay on a fresh interpreter (``subprocess``): the interpreter's
start-up itself (the warnings a fresh ``import`` prints: ``test_quiet_first_fit.py``; the modules ``import
recipes.cli`` loads: ``test_benchmarks.py``) and a project of the user's own (``test_import_into_project.py``).
What a library reads from the environment only at import (torch's ``OMP_NUM_THREADS``, the size of its thread pool)
is the server's: ``import_env`` starts a server with those variables (``test_torch_threads.py``: a 1-core and a
2-core machine), shared by the runs that ask for the same.

The server imports torch but runs no torch operation before it forks, so no OpenMP thread pool exists yet in the
process that forks.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# what ``recipes fit``/``sync``/``compare`` and the tests' own callbacks import anyway: loaded once by the server
RECIPES = (
    "torch",
    "lightning.pytorch",
    "torchmetrics",
    "mlflow",
    "mlflow.tracking",
    "mlflow.store.tracking.sqlalchemy_store",
    "jsonargparse",
    "torch.distributed.run",  # torchrun, whose worker processes are forked too (``test_multi_node.py``)
    "recipes.cli",
    "recipes.run.recipes_cli",
    "recipes.tracking.logger",
    "lightning_modules",
    "datamodules",
)
# third-party libraries only, for a process that must start with none of loopwise imported (a checkpoint, an export or
# an MLflow model loaded in a process that never ran loopwise): loopwise's own modules are imported by the process
LIBRARIES = (
    "torch",
    "lightning.pytorch",
    "torchmetrics",
    "mlflow",
    "mlflow.pyfunc",
    "pandas",
    "PIL.Image",
    "transformers",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.image_processing_auto",
)

SERVER = r'''
import atexit, io, json, os, select, signal, socket, sys, threading, traceback

preload, path, helper_file = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
base_path = list(sys.path)
env_before = dict(os.environ)
import importlib
for name in preload:
    importlib.import_module(name)
# what the imports themselves set in the environment (a fresh process would set it too)
set_by_imports = {k: v for k, v in os.environ.items() if env_before.get(k) != v}

listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(path)
listener.listen(16)
print("ready", flush=True)


def exit_code(error):
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def fork_launched_ranks():
    """The launchers of a multi-process run start their processes with ``subprocess.Popen`` of ``python [-u] -m
    <module> ...``: Lightning's DDP launcher its ranks 1.. (``subprocess.Popen(command, env=..., cwd=...)``), torchrun
    its workers (``Popen(args=..., env=..., stdout=..., stderr=..., start_new_session=True)``). Those are forked from
    this server too, so a multi-process run pays no fresh interpreter either; any other command runs as it would."""
    import importlib.util, subprocess

    spec = importlib.util.spec_from_file_location("_preloaded_python", helper_file)
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)

    def popen(args, env=None, cwd=None, stdout=None, stderr=None, start_new_session=False, **kwargs):
        try:
            forked = not kwargs and args[0] == sys.executable and helper._parse(args)[0] is not None
        except ValueError:
            forked = False
        if not forked:
            return subprocess.Popen(args, env=env, cwd=cwd, stdout=stdout, stderr=stderr,
                                    start_new_session=start_new_session, **kwargs)
        return helper.PreloadedProcess(args, cwd=cwd or os.getcwd(), env=dict(os.environ if env is None else env),
                                       stdout=stdout, stderr=stderr, address=path, new_session=start_new_session)

    class LaunchersSubprocess:
        """The ``subprocess`` module as Lightning's launchers see it, with the ``Popen`` above."""

        Popen = staticmethod(popen)

        def __getattr__(self, name):
            return getattr(subprocess, name)

    for name in ("lightning.fabric.strategies.launchers.subprocess_script",
                 "lightning.pytorch.strategies.launchers.subprocess_script"):
        if name in sys.modules:
            sys.modules[name].subprocess = LaunchersSubprocess()
    torchrun = sys.modules.get("torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler")
    if torchrun is not None:
        torchrun.Popen = popen


def child(request, fds):
    listener.close()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
        signal.signal(signum, signal.SIG_DFL)
    if request.get("new_session"):
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in set_by_imports.items():
        os.environ.setdefault(key, value)
    unbuffered = request["unbuffered"] or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    python_path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")
    if rank_zero is not None:  # Lightning reads the process's rank once, at import: the first of these that is set
        keys = [key for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK") if key in os.environ]
        rank_zero.rank_zero_only.rank = int(os.environ[keys[0]]) if keys else 0
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS (random reseeds by itself)
        sys.modules["numpy"].random.seed()
    code = 0
    try:
        if request["module"] is not None:
            import runpy
            sys.path[:] = [os.getcwd(), *python_path, *base_path[1:]]
            sys.argv = [request["module"], *request["args"]]
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            sys.path[:] = ["", *python_path, *base_path[1:]]
            sys.argv = ["-c", *request["args"]]
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as error:
        code = exit_code(error)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    try:
        threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads
        atexit._run_exitfuncs()
    except SystemExit as error:
        code = exit_code(error)
    except BaseException:
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt: Python ends by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code & 0xFF)


fork_launched_ranks()  # once, here: every forked process inherits the patched launchers
waiting = {}  # pid -> the connection that waits for its exit status
parent = os.getppid()
while os.getppid() == parent:  # the test process that started this server is gone: so is the server
    readable = select.select([listener], [], [], 0.02)[0]
    if readable:
        connection, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message)
        if request.get("stop"):
            break
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            connection.close()
            for other in waiting.values():
                other.close()
            child(request, fds)
        for fd in fds:
            os.close(fd)
        connection.sendall(f"{pid}\n".encode())
        waiting[pid] = connection
    while waiting:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            break
        connection = waiting.pop(pid, None)
        if connection is not None:
            try:
                connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            connection.close()
'''


class _Server:
    """A preloaded server of this (xdist worker) process, one per preload list and environment at import, started on
    first use and stopped at exit."""

    started: dict[tuple[tuple[str, ...], tuple[tuple[str, str], ...]], tuple[subprocess.Popen, str]] = {}

    @classmethod
    def address(cls, preload: tuple[str, ...], import_env: Mapping[str, str] | None = None) -> str:
        key = (preload, tuple(sorted((import_env or {}).items())))
        process, path = cls.started.get(key, (None, ""))
        if process is None or process.poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="preloaded-"), "server.sock")
            from tests.conftest import recipes_env

            process = subprocess.Popen(
                [sys.executable, "-c", SERVER, json.dumps(preload), path, __file__],
                env={**recipes_env(), **(import_env or {})},
                stdout=subprocess.PIPE, stderr=None, text=True, stdin=subprocess.DEVNULL,
            )
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"the preloaded Python server did not start (it said {line!r})")
            if not cls.started:
                atexit.register(cls.stop)
            cls.started[key] = (process, path)
        return path

    @classmethod
    def stop(cls) -> None:
        for process, _ in cls.started.values():
            if process.poll() is None:
                process.kill()
                process.wait()


class PreloadedProcess:
    """One process forked from the preloaded server, used like ``subprocess.Popen``: ``pid``, ``stdout`` (a text
    stream when ``stdout=subprocess.PIPE``), ``send_signal``/``terminate``/``kill``, ``poll``, ``wait`` and
    ``returncode`` (negative: the signal that ended it). ``address``: the server's socket, for a process forked from
    it that starts another (a DDP rank); otherwise this worker's server of ``preload``, started on first use.
    ``new_session``: the process leads a session (and process group) of its own, as ``start_new_session=True``.
    ``import_env``: variables the server had in its environment when it imported ``preload`` (what a library reads
    only at import, such as torch's ``OMP_NUM_THREADS``); a server is started for each such environment."""

    def __init__(self, argv: Sequence[str], *, cwd: str | Path, env: dict[str, str], stdout: Any, stderr: Any,
                 preload: tuple[str, ...] = RECIPES, address: str | None = None, new_session: bool = False,
                 import_env: Mapping[str, str] | None = None) -> None:
        module, code, args, unbuffered = _parse(argv)
        self._files: list[Any] = []
        ends = [os.open(os.devnull, os.O_RDONLY)]
        self.stdout = self.stderr = None
        for which, target in (("stdout", stdout), ("stderr", stderr)):
            if target == subprocess.PIPE:
                read, write = os.pipe()
                setattr(self, which, open(read, encoding="utf-8", errors="replace"))
                ends.append(write)
            elif target == subprocess.STDOUT:
                ends.append(os.dup(ends[1]))
            elif target == subprocess.DEVNULL or target is None:
                ends.append(os.open(os.devnull, os.O_WRONLY) if target == subprocess.DEVNULL else os.dup(
                    1 if which == "stdout" else 2))
            else:  # a file object or a descriptor
                ends.append(os.dup(target if isinstance(target, int) else target.fileno()))
        request = {"module": module, "code": code, "args": args, "unbuffered": unbuffered, "cwd": str(cwd),
                   "env": dict(env), "new_session": new_session}
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._connection.connect(address or _Server.address(preload, import_env))
        socket.send_fds(self._connection, [json.dumps(request).encode()], ends)
        for fd in ends:
            os.close(fd)
        self._received = b""
        self.args = list(argv)
        self.returncode: int | None = None
        self.pid = int(self._line(None))

    def _line(self, timeout: float | None) -> str:
        """The server's next line on this connection; "" when none came within ``timeout`` (0: none waiting)."""
        import select

        while b"\n" not in self._received:
            if not select.select([self._connection], [], [], timeout)[0]:
                return ""
            chunk = self._connection.recv(4096)
            if not chunk:
                raise RuntimeError("the preloaded Python server ended before the process it forked")
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return line.decode()

    def poll(self) -> int | None:
        if self.returncode is None:
            line = self._line(0)
            if line:
                self.returncode = int(line)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            line = self._line(timeout)
            if not line:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = int(line)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """As ``subprocess.Popen.send_signal``: nothing once the process has ended."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # ended since
                pass

    def terminate(self) -> None:
        import signal

        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[str | None, str | None]:
        """Both pipes read to their end (each in a thread, as ``subprocess`` does), then the exit status."""
        out: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=n, s=s: out.__setitem__(n, s.read()), daemon=True)
                   for n, s in (("stdout", self.stdout), ("stderr", self.stderr)) if s is not None]
        for reader in readers:
            reader.start()
        try:
            self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise
        for reader in readers:
            reader.join()
        return out.get("stdout"), out.get("stderr")

    def close(self) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self._connection.close()

    def __enter__(self) -> PreloadedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.returncode is None:
            self.kill()
            self.wait()
        self.close()


def _parse(argv: Sequence[str]) -> tuple[str | None, str | None, list[str], bool]:
    """(module, code, arguments, unbuffered) of ``[sys.executable, [-u], -m module | -c code, *arguments]``."""
    rest = list(argv[1:])
    unbuffered = False
    while rest and rest[0] == "-u":
        unbuffered = True
        rest.pop(0)
    if len(rest) >= 2 and rest[0] == "-m":
        return rest[1], None, rest[2:], unbuffered
    if len(rest) >= 2 and rest[0] == "-c":
        return None, rest[1], rest[2:], unbuffered
    raise ValueError(f"a preloaded process runs `python [-u] -m module ...` or `python [-u] -c code ...`: {argv}")


def preloaded_popen(argv: Sequence[str], *, cwd: str | Path, env: dict[str, str], stdout: Any = None,
                    stderr: Any = None, text: bool = True, preload: tuple[str, ...] = RECIPES,
                    import_env: Mapping[str, str] | None = None) -> PreloadedProcess:
    """``subprocess.Popen(argv, cwd=cwd, env=env, stdout=..., stderr=..., text=True)`` for ``argv`` =
    ``[sys.executable, [-u], -m module | -c code, *arguments]``, forked from the server that imported ``preload``
    (``RECIPES``, or ``LIBRARIES`` for a process that must import loopwise itself) with ``import_env`` in its
    environment; pipes are always text."""
    assert text, "a preloaded process's pipes are text streams"
    return PreloadedProcess(argv, cwd=cwd, env=env, stdout=stdout, stderr=stderr, preload=preload,
                            import_env=import_env)


def preloaded_run(argv: Sequence[str], *, cwd: str | Path, env: dict[str, str], timeout: float | None = None,
                  preload: tuple[str, ...] = RECIPES,
                  import_env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``, forked from the
    server that imported ``preload`` with ``import_env`` in its environment."""
    with preloaded_popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preload=preload, import_env=import_env) as process:
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(list(argv), process.returncode, out, err)
