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
exits with status 2: the shared 2-core VM this project's CI runs on exposes no hardware counters.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import struct
import sys
from pathlib import Path
from typing import Any

PERF_TYPE_HARDWARE, PERF_TYPE_SOFTWARE = 0, 1
# name: (type, config): PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS
EVENTS = {"cycles": (PERF_TYPE_HARDWARE, 0), "instructions": (PERF_TYPE_HARDWARE, 1)}
SYSCALL = {"x86_64": 298, "aarch64": 241}  # __NR_perf_event_open
IOC_ENABLE, IOC_DISABLE, IOC_RESET = 0x2400, 0x2401, 0x2403
DISABLED, EXCLUDE_KERNEL, EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6  # perf_event_attr's flag bits


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


def measure(repeats: int, epochs: int, variants: tuple[str, ...]) -> dict[str, list[dict[str, float]]]:
    """Per variant, one ``{"cycles", "instructions"}`` per step for each interleaved repetition."""
    from _common import set_threads
    from instruction_counts import loop_windows

    set_threads(1)
    counters = ThreadCounters()
    results: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
    try:
        for repetition in range(repeats):
            for variant in variants:
                counters.read()
                steps = loop_windows(lambda on: counters.start() if on else counters.stop(), (variant,), epochs)
                counts = counters.read()
                row = {name: value / steps[variant] for name, value in counts.items()}
                results[variant].append(row)
                print(f"  rep {repetition + 1}/{repeats} {variant:>9}: {row['cycles']:12,.0f} cycles "
                      f"{row['instructions']:12,.0f} instructions per step", flush=True)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--variants", nargs="+", default=["seeds", "bare", "barefused", "recipe"],
                        choices=["seeds", "bare", "barefused", "recipe"])
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args()
    try:
        ThreadCounters().close()
    except CountersUnavailable as error:
        print(f"cycle_counts: this machine does not let the process count its cycles ({error}); run it where "
              "`perf stat -e cycles true` works (instruction_counts.py counts instructions here)", file=sys.stderr)
        sys.exit(2)
    figures = report(measure(args.repeats, args.epochs, tuple(args.variants)))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
