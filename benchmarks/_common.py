"""Helpers the benchmark scripts share: machine description, in-process recipe runs, a training-loop timer.

Not a benchmark itself. Scripts in this folder import it as ``_common`` (Python puts the script's folder first on
``sys.path``); the recipe runs name ``_common.LoopTimer`` as a callback class path for the same reason. The startup
benchmark's fit names ``_common.FirstStepClock``; that script itself does not import this module (it would import
Lightning).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any, ClassVar, Iterator

from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # the packages of this checkout win over an installed copy


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or platform's guess)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(threads: bool = True) -> str:
    """One line: CPU model, cores, torch version (and this process's torch threads), accelerator."""
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    count = f" ({torch.get_num_threads()} threads)" if threads else ""
    return (
        f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}{count}, "
        f"{device}, Python {platform.python_version()}"
    )


def commit() -> str:
    """Short git commit of this checkout (``+dirty`` with uncommitted changes), or "unknown"."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


@contextmanager
def in_directory(path: Path) -> Iterator[None]:
    """chdir into ``path`` (created) for the block."""
    old = Path.cwd()
    path.mkdir(parents=True, exist_ok=True)
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@contextmanager
def quiet() -> Iterator[None]:
    """Swallow stdout and stderr (epoch lines, Lightning's banners) of a recipe run."""
    import logging
    import warnings

    loggers = [logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric", "mlflow")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with redirect_stdout(StringIO()), redirect_stderr(StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time, "thread": time.thread_time}
_clock = time.perf_counter


def set_clock(name: str) -> None:
    """Time with the wall clock (default), this process's CPU time (``cpu``: robust on a machine shared with other
    busy processes when torch runs 1 thread and loaders run in the main process, but blind to waiting, e.g. for
    disk writes or a GPU) or the calling thread's CPU time (``thread``: the training loop's own work, with 1 torch
    thread; it leaves out background threads such as MLflow's writer, which ``logging_overhead.py`` measures)."""
    global _clock
    _clock = CLOCKS[name]


def clock() -> float:
    """The chosen clock's reading in seconds (``set_clock``)."""
    return _clock()


_RECIPE_THREADS: list[str] = []  # set by ``set_threads``: ``--torch_threads N`` for an in-process ``recipes fit``


def set_threads(threads: int | None) -> None:
    """Fix torch's intra-op threads (``None`` keeps torch's default), for this process's loops and for the recipes
    run in it (``recipe_thread_args``: their YAML's ``torch_threads`` would set another count). On a machine shared
    with other busy processes, 1 thread avoids OpenMP threads spinning against each other, which can slow small steps
    tenfold."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    _RECIPE_THREADS[:] = ["--torch_threads", str(threads)] if threads is not None else []


def recipe_thread_args() -> list[str]:
    """``--torch_threads N`` after ``set_threads(N)`` (nothing when it kept torch's default): the same threads for a
    recipe as for the other loops of a benchmark."""
    return list(_RECIPE_THREADS)


def cuda_missing(benchmark: str, device: str, json_path: Path | None, smoke: str) -> bool:
    """Whether ``device`` is "cuda" and torch sees no CUDA device; then says so (with the CPU smoke-run command
    ``smoke``) and writes ``{"benchmark": ..., "skipped": "no CUDA device"}`` to ``json_path`` when given."""
    import torch

    if device != "cuda" or torch.cuda.is_available():
        return False
    print(f"{benchmark}: skipped: torch sees no CUDA device (run with {smoke} for a smoke run)")
    if json_path:
        json_path.write_text(json.dumps({"benchmark": benchmark, "skipped": "no CUDA device"}))
    return True


def synchronize(device: Any = None) -> None:
    """Wait for queued GPU work so a wall-clock reading covers it (no-op on CPU)."""
    import torch

    if torch.cuda.is_available() and (device is None or getattr(device, "type", str(device)) == "cuda"):
        torch.cuda.synchronize()


class LoopTimer(Callback):
    """A Lightning callback that times the training batches of every epoch (not validation or checkpoints).

    An epoch's time runs from ``on_train_epoch_start`` to the last ``on_train_batch_end``; with the samples and
    steps of the epoch it is appended to ``LoopTimer.epochs`` (class-level, so a script reads it after an
    in-process ``recipes fit`` that built the callback from its class path). ``LoopTimer.rss`` records the
    resident set size after each epoch's training batches, in bytes.
    """

    epochs: ClassVar[list[tuple[int, float, int, int]]] = []  # (epoch, seconds, samples, steps)
    rss: ClassVar[list[tuple[int, int]]] = []  # (epoch, bytes)

    def __init__(self) -> None:
        from recipes.compat.internals import skip_batch_hooks

        # Lightning calls every callback's batch hooks, the base class's no-ops too (five a step here): the timer
        # would add their dispatch to the Lightning loops it times and not to the plain loops they are compared with
        skip_batch_hooks(self)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        synchronize(pl_module.device)
        self.samples = 0
        self.steps = 0
        self.start = self.end = clock()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        inputs = batch[0] if isinstance(batch, (tuple, list)) else batch
        self.samples += int(inputs.shape[0])
        self.steps += 1
        if batch_idx + 1 >= trainer.num_training_batches:
            synchronize(pl_module.device)
        self.end = clock()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        LoopTimer.epochs.append((trainer.current_epoch, self.end - self.start, self.samples, self.steps))
        LoopTimer.rss.append((trainer.current_epoch, rss_bytes()))

    @classmethod
    def reset(cls) -> None:
        cls.epochs = []
        cls.rss = []


class NoHostSyncs(Callback):
    """On CUDA, ``torch.cuda.set_sync_debug_mode("error")`` from the start to the end of every training batch where
    nothing is read (not a logging step, not the epoch's last batch, not the run's last step): a host-device
    synchronisation there raises, naming the operation (``tests/lightning_modules/test_host_syncs.py`` counts the same reads on CPU).
    Nothing happens on CPU."""

    @staticmethod
    def ordinary(trainer: Any) -> bool:
        from recipes.doctor.read_steps import is_read_step

        return not is_read_step(trainer)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        import torch

        if pl_module.device.type == "cuda" and self.ordinary(trainer):
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        import torch

        if pl_module.device.type == "cuda":
            torch.cuda.set_sync_debug_mode("default")


class FitTimer(Callback):
    """Seconds from the first training batch to the end of training, validation, checkpoint writes and logging
    included, and the optimizer steps taken: ``FitTimer.last = {"start", "seconds", "steps"}`` (class-level, read
    after an in-process ``recipes fit``), with the training thread's CPU seconds (``thread_seconds``) and the whole
    process's (``process_seconds``: torch's threads and background threads such as MLflow's writer too)."""

    last: ClassVar[dict[str, float]] = {}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if "start" not in FitTimer.last:
            FitTimer.last.update(start=time.perf_counter(), thread_start=time.thread_time(),
                                 process_start=time.process_time())

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        FitTimer.last["seconds"] = time.perf_counter() - FitTimer.last["start"]
        FitTimer.last["thread_seconds"] = time.thread_time() - FitTimer.last["thread_start"]
        FitTimer.last["process_seconds"] = time.process_time() - FitTimer.last["process_start"]
        FitTimer.last["steps"] = trainer.global_step


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc/self/statm), 0 where unavailable."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss_bytes() -> int:
    """Peak resident set size of this process so far (``getrusage``; kilobytes on Linux)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) * (1 if sys.platform == "darwin" else 1024)


def epoch_rates(epochs: list[tuple[int, float, int, int]], skip: int = 1) -> list[float]:
    """Samples per second of each epoch after the first ``skip`` (a noisy machine slows some epochs, never speeds
    one up: the fast epochs, e.g. the 90th percentile, show the loop's own cost)."""
    timed = epochs[skip:] if len(epochs) > skip else epochs
    return [e[2] / e[1] for e in timed if e[1] > 0]


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (nearest rank; NaN when empty)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def throughput(epochs: list[tuple[int, float, int, int]], skip: int = 1) -> tuple[float, int, float]:
    """(samples per second, steps, seconds) over the epochs after the first ``skip``."""
    timed = epochs[skip:] if len(epochs) > skip else epochs
    seconds = sum(e[1] for e in timed)
    samples = sum(e[2] for e in timed)
    return (samples / seconds if seconds > 0 else float("nan")), sum(e[3] for e in timed), seconds


class FirstStepClock(Callback):
    """Prints the seconds from the process's start to its first training step, then ends the process (startup.py).

    The start is the wall-clock time the benchmark put in ``STARTUP_CLOCK_T0`` just before it started the process;
    the line also names the heavy libraries the process had loaded by then.
    """

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        elapsed = time.time() - float(os.environ["STARTUP_CLOCK_T0"])
        heavy = json.loads(os.environ.get("STARTUP_CLOCK_HEAVY", "[]"))
        print(f"FIRST_STEP {elapsed:.4f}", flush=True)
        print("LOADED " + json.dumps([name for name in heavy if name in sys.modules]), flush=True)
        raise SystemExit(0)  # what comes after the first step is not start-up (and is not timed)
