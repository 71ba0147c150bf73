"""Cycles and instructions of the training thread, from the CPU's own counters, for the loops ``overhead.py`` times.

    python benchmarks/cycle_counts.py                  # seeds, bare, barefused, recipe; 5 interleaved repetitions
    python benchmarks/cycle_counts.py --repeats 9 --epochs 10 --json results.json

``instruction_counts.py`` counts instructions (and models caches, TLBs and branches) under valgrind; what it cannot
count is how many instructions the core retires per cycle, and that is where the spiral recipe's remaining gap to
the seeds' loop lies (``benchmarks/README.md``, "Issue 32, stop 49"). This script reads the hardware counters
themselves (``perf_event_open`` on the training thread: user-space cycles and retired instructions) over the same
windows as ``overhead.py`` (the training batches of epochs 2..N), for the same variants in interleaved repetitions,
and prints per variant the median cycles and instructions per step and instructions per cycle, with the ratios
(seeds / recipe cycles per step: a speed ratio at a fixed clock, and much steadier than time on a shared machine).
With ``instruction_counts.py --question loop``'s split of each variant's instructions by library, the per-cycle
rates say how much slower an interpreter instruction is than a kernel's.

Needs a machine whose kernel lets this process count its own thread's cycles (``perf stat -e cycles true`` works
there; ``/proc/sys/kernel/perf_event_paranoid`` at 2 or below). Where it cannot, the script says so in one line and
exits with status 2: the shared 2-core VMs this project's CI runs on (AMD EPYC and Intel Xeon) expose no hardware
counters.

    python benchmarks/cycle_counts.py --usage --repeats 7 --epochs 10

``--usage`` works on any Linux machine: over the same windows it reads what the kernel accounts to the training
thread (``getrusage(RUSAGE_THREAD)``: user and system CPU time, page faults, voluntary context switches, that is
waits, and preemptions) with its exact CPU time and the wall time, and prints their medians per step and the paired
CPU-time and wall-time ratios. It tells a loop's own work (user CPU time) from time in the kernel (page faults,
system calls) and from time spent waiting (for the GIL while another thread of the process runs, for a lock, for
I/O), which ``overhead.py``'s thread clock leaves out.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
# name: (type, config): PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS
EVENTS = {"cycles": (PERF_TYPE_HARDWARE, 0), "instructions": (PERF_TYPE_HARDWARE, 1)}
SYSCALL = {"x86_64": 298, "aarch64": 241}  # __NR_perf_event_open
IOC_ENABLE, IOC_DISABLE, IOC_RESET = 0x2400, 0x2401, 0x2403
DISABLED, EXCLUDE_KERNEL, EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6  # perf_event_attr's flag bits
# --usage: getrusage's field for each figure (times in microseconds)
USAGE_FIELDS = {"user_us": "ru_utime", "system_us": "ru_stime", "minor_faults": "ru_minflt",
                "major_faults": "ru_majflt", "waits": "ru_nvcsw", "preemptions": "ru_nivcsw"}


class CountersUnavailable(RuntimeError):
    """This process cannot count its thread's cycles (no PMU in the virtual machine, or the kernel forbids it)."""


class ThreadCounters:
    """User-space cycles and instructions of the calling thread, counted between ``start`` and ``stop`` and summed
    over every window until ``read``.

    Args:
        events: ``{name: (perf type, config)}``; by default ``EVENTS`` (the hardware's cycles and instructions).
    """

    def __init__(self, events: dict[str, tuple[int, int]] | None = None) -> None:
        number = SYSCALL.get(platform.machine())
        if number is None:
            raise CountersUnavailable(f"perf_event_open is not wired up here for {platform.machine()}")
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fds: dict[str, int] = {}
        for name, (kind, config) in (events or EVENTS).items():
            # perf_event_attr, version 0 (64 bytes): type, size, config, sample_period, sample_type, read_format,
            # flags, wakeup_events, bp_type, config1
            attr = struct.pack("IIQQQQQIIQ", kind, 64, config, 0, 0, 0,
                               DISABLED | EXCLUDE_KERNEL | EXCLUDE_HV, 0, 0, 0)
            buffer = ctypes.create_string_buffer(attr, 64)
            fd = self.libc.syscall(number, buffer, 0, -1, -1, 0)  # this thread, any CPU, no group, no flags
            if fd < 0:
                error = ctypes.get_errno()
                self.close()
                raise CountersUnavailable(f"perf_event_open({name}): {os.strerror(error)}")
            self.fds[name] = fd
            self.libc.ioctl(fd, IOC_RESET, 0)

    def start(self) -> None:
        for fd in self.fds.values():
            self.libc.ioctl(fd, IOC_ENABLE, 0)

    def stop(self) -> None:
        for fd in self.fds.values():
            self.libc.ioctl(fd, IOC_DISABLE, 0)

    def read(self) -> dict[str, int]:
        """The counts since the last ``read`` (then reset)."""
        counts = {name: struct.unpack("Q", os.read(fd, 8))[0] for name, fd in self.fds.items()}
        for fd in self.fds.values():
            self.libc.ioctl(fd, IOC_RESET, 0)
        return counts

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}


class ThreadUsage:
    """What the kernel accounts to the calling thread (``USAGE_FIELDS``, from ``getrusage(RUSAGE_THREAD)``; its
    user / system split is sampled at the scheduler's ticks and can lag by one), the thread's CPU time as
    ``overhead.py``'s thread clock reads it (``cpu_us``: exact) and the wall time (``wall_us``), summed over every
    window between ``start`` and ``stop`` until ``read``; the same interface as ``ThreadCounters``, on any Linux
    machine."""

    def __init__(self) -> None:
        self.totals = dict.fromkeys([*USAGE_FIELDS, "cpu_us", "wall_us"], 0.0)
        self.mark: tuple[Any, float, float] | None = None

    @staticmethod
    def now() -> tuple[Any, float, float]:
        return resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), time.perf_counter()

    def start(self) -> None:
        self.mark = self.now()

    def stop(self) -> None:
        (usage, cpu, wall), (before, cpu_before, started) = self.now(), self.mark
        for name, field in USAGE_FIELDS.items():
            scale = 1e6 if name.endswith("_us") else 1
            self.totals[name] += (getattr(usage, field) - getattr(before, field)) * scale
        self.totals["cpu_us"] += (cpu - cpu_before) * 1e6
        self.totals["wall_us"] += (wall - started) * 1e6
        self.mark = None

    def read(self) -> dict[str, float]:
        """The sums since the last ``read`` (then reset)."""
        totals, self.totals = self.totals, dict.fromkeys(self.totals, 0.0)
        return totals

    def close(self) -> None:
        pass


def measure(repeats: int, epochs: int, variants: tuple[str, ...],
            counters: ThreadCounters | ThreadUsage | None = None) -> dict[str, list[dict[str, float]]]:
    """Per variant, one row of ``counters``' figures per step (by default ``ThreadCounters``: ``{"cycles",
    "instructions"}``) for each interleaved repetition."""
    from _common import set_threads
    from instruction_counts import loop_windows

    set_threads(1)
    counters = counters or ThreadCounters()
    results: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
    try:
        for repetition in range(repeats):
            for variant in variants:
                counters.read()
                steps = loop_windows(lambda on: counters.start() if on else counters.stop(), (variant,), epochs)
                counts = counters.read()
                row = {name: value / steps[variant] for name, value in counts.items()}
                results[variant].append(row)
                shown = "  ".join(f"{name} {value:,.2f}" for name, value in row.items())
                print(f"  rep {repetition + 1}/{repeats} {variant:>9}: {shown} per step", flush=True)
    finally:
        counters.close()
    return results


def report(results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Print and return the medians per step, instructions per cycle and the cycle ratios (paired by repetition)."""
    figures: dict[str, Any] = {"per_step": {}, "ratios": {}}
    print(f"{'variant':>9} {'cycles/step':>13} {'instructions/step':>18} {'per cycle':>10}")
    for variant, rows in results.items():
        cycles = statistics.median(r["cycles"] for r in rows)
        instructions = statistics.median(r["instructions"] for r in rows)
        ipc = statistics.median(r["instructions"] / r["cycles"] for r in rows)
        figures["per_step"][variant] = {"cycles": cycles, "instructions": instructions, "ipc": ipc}
        print(f"{variant:>9} {cycles:13,.0f} {instructions:18,.0f} {ipc:10.2f}")
    for a, b in (("recipe", "seeds"), ("barefused", "seeds"), ("recipe", "barefused"), ("recipe", "bare")):
        if results.get(a) and results.get(b):
            paired = statistics.median(y["cycles"] / x["cycles"] for x, y in zip(results[a], results[b]))
            figures["ratios"][f"{a} / {b}"] = paired
            print(f"{a} / {b}: {paired:.3f} (cycles per step of {b} / of {a}, median of the repetitions' own ratios)")
    return figures


def report_usage(results: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """``--usage``: print and return the medians per step of ``ThreadUsage``'s figures and of the time off the CPU
    (``off_cpu_us``: wall minus CPU time), and the CPU-time and wall-time ratios (paired by repetition: the other
    variant's time per step / this one's, a speed ratio)."""
    figures: dict[str, Any] = {"per_step": {}, "ratios": {}}
    names = [*USAGE_FIELDS, "cpu_us", "wall_us", "off_cpu_us"]  # off the CPU: waiting, or runnable, not running
    print(f"{'variant':>9} " + " ".join(f"{name:>12}" for name in names))
    for variant, rows in results.items():
        rows = [{**r, "off_cpu_us": r["wall_us"] - r["cpu_us"]} for r in rows]
        figures["per_step"][variant] = {name: statistics.median(r[name] for r in rows) for name in names}
        print(f"{variant:>9} " + " ".join(f"{figures['per_step'][variant][name]:12,.2f}" for name in names))
    for a, b in (("recipe", "seeds"), ("barefused", "seeds"), ("recipe", "barefused"), ("recipe", "bare"),
                 ("recipe", "nomlflow")):
        if results.get(a) and results.get(b):
            for name in ("cpu_us", "wall_us"):
                paired = statistics.median(y[name] / x[name] for x, y in zip(results[a], results[b]))
                figures["ratios"][f"{a} / {b} ({name})"] = paired
                print(f"{a} / {b}: {paired:.3f} ({name} per step of {b} / of {a}, median of the repetitions' own "
                      "ratios)")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--variants", nargs="+", default=["seeds", "bare", "barefused", "recipe"],
                        choices=["seeds", "bare", "barefused", "recipe", "nomlflow"],
                        help="nomlflow: the recipe without a logger, as in overhead.py")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--usage", action="store_true",
                        help="what the kernel accounts to the thread (CPU time, faults, waits) instead of cycles")
    args = parser.parse_args()
    if args.usage:
        figures = report_usage(measure(args.repeats, args.epochs, tuple(args.variants), ThreadUsage()))
    else:
        try:
            ThreadCounters().close()
        except CountersUnavailable as error:
            print(f"cycle_counts: this machine does not let the process count its cycles ({error}); run it where "
                  "`perf stat -e cycles true` works, or use --usage (instruction_counts.py counts instructions here)",
                  file=sys.stderr)
            sys.exit(2)
        figures = report(measure(args.repeats, args.epochs, tuple(args.variants)))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
