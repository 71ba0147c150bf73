"""What MLflow tracking and Lightning's loop cost the spiral recipe, counted in machine instructions (valgrind's
callgrind), not seconds.

    python benchmarks/instruction_counts.py [--question logging] [--epochs 10] [--dilation 25] [--json PATH]
    python benchmarks/instruction_counts.py --question loop [--epochs 6] [--json PATH]
    python benchmarks/instruction_counts.py --question positions --simulate [--last-level 524288,8,64] [--epochs 5]

``logging_overhead.py`` times the spiral recipe with its MLflow logger and without a logger. On the shared 2-core
machine one variant's runs spread by 10-30% (even in the training thread's CPU time: the host's load changes the
speed of every instruction), so a 5% effect needs dozens of pairs and its median still moves by a few percent from
one session to the next. This script counts instead: it runs the same two recipe fits in one process under
``valgrind --tool=callgrind`` (it starts valgrind itself), switches the counting on at the first training batch and
off at the end of training (the window ``logging_overhead.py`` times: training, validation, checkpoint saves and
logging), and prints the instructions executed in that window per thread. The counts repeat from run to run to a
fraction of a percent, so one pair answers what twenty timed pairs estimate.

Printed: instructions per optimizer step on the training thread (where Lightning, the task and the logging calls
run), in the other threads (MLflow's writer and worker threads, the journal's fsync), and their ratios without /
with MLflow: the training thread's ratio is the share of the loop's work that MLflow logging adds.

What counts do not show: instructions are not all equally fast (cache misses, the kernel's side of a system call,
a wait on ``fsync``), so this complements the timed benchmark, it does not replace it. Under valgrind the program
runs about 25-50x slower, so whatever the wall clock drives would happen more often per step than in a native run:
the held metrics' 5 s (``HeldMetrics.hold_seconds``) and MLflow's asynchronous buffering
(``MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS``) are multiplied by ``--dilation`` to keep them per step as they are
natively. A warm-up fit runs first, uncounted (imports, MLflow's schema, first calls).

``--question loop`` counts what ``overhead.py`` times: the training batches of every epoch after the first (no
validation, no checkpoints) of the seeds' hand-written loop (``seeds``), bare Lightning with torch's default and with
the recipe's fused optimizer kernel (``bare``, ``barefused``) and the recipe (``recipe``), on the spiral MLP, and
prints instructions per training step on the training thread and the ratios: what Lightning's own loop executes per
step beyond the seeds' loop, and what the recipe adds beyond bare Lightning. Switching the counting on and off runs
``callgrind_control`` in a subprocess, which adds its own instructions to every counted epoch; a calibration window
with nothing in it measures them, and they are subtracted from the totals (not from the split below). It also splits
each variant's instructions by where they ran (``callgrind_annotate``'s exclusive cost per function, summed by
library: the Python interpreter, torch with its kernels, the C library, the rest): the same count of instructions
takes longer in the interpreter (branches, pointer chasing) than in torch's vectorized kernels, so two loops with
equal totals need not be equally fast. ``--simulate`` models caches and branch prediction to estimate cycles, a model
that still counts one cycle for every instruction.

``--question positions`` counts seeds, barefused and recipe by position in the epoch (the first batch, the middle
ones, the last, and the gap between two epochs' training batches: validation, checkpoints, logging), with the
instrumentation on from the end of epoch 1's training batches to the end of each fit, so that ``--simulate``'s cache
model sees what the gaps leave in the caches (``--question loop`` switches it off between its windows, so it models
every epoch's first batch as warm). Callgrind models two cache levels; ``--last-level 524288,8,64`` makes the last
one the host's 512 KiB L2 instead of the L3; ``--tlb`` models the TLBs (4 KiB pages as lines) and counts page walks.

Needs valgrind (``callgrind_control`` sends the switches); about 6 minutes for 10 epochs on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

INNER = "LOOPWISE_CALLGRIND_INNER"  # set in the process valgrind runs
LABELS = ("mlflow", "none")
LOOP_VARIANTS = ("seeds", "bare", "barefused", "recipe")
SYSTEM_METRICS = 10.0  # seconds between a recipe's system-metric samples (its --system_metrics_interval default)


def control(*args: str) -> None:
    """Send one command to the callgrind instance running this process (``callgrind_control``)."""
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True, capture_output=True)


def prepare_counted_process(dilation: float) -> None:
    """Inside valgrind, before any fit: 1 torch thread, the embedded store, and the wall-clock intervals of the
    recipe's logging path multiplied by valgrind's slowdown: the held metrics' and MLflow's asynchronous buffer (5 s).
    (MLflow's system metrics, every 10 s in a recipe: ``SYSTEM_METRICS``.)"""
    from _common import set_threads

    from recipes.tracking import logger

    set_threads(1)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    logger.ASYNC_BUFFER_SECONDS = logger.ASYNC_BUFFER_SECONDS * dilation
    os.environ[logger.ASYNC_BUFFER_ENV] = str(logger.ASYNC_BUFFER_SECONDS)


def counted_fits(epochs: int, dilation: float) -> dict[str, int]:
    """Inside valgrind: a warm-up fit, then one counted fit with MLflow and one without; optimizer steps of each."""
    import logging_overhead
    from _common import FitTimer

    prepare_counted_process(dilation)

    label = [""]
    start, end = FitTimer.on_train_batch_start, FitTimer.on_train_end

    def counted_start(self: Any, trainer: Any, *args: Any) -> None:
        if label[0] and "start" not in FitTimer.last:
            control("--zero")
            control("--instr=on")
        start(self, trainer, *args)

    def counted_end(self: Any, trainer: Any, pl_module: Any) -> None:
        end(self, trainer, pl_module)
        if label[0]:
            control("--instr=off")
            control(f"--dump={label[0]}")

    FitTimer.on_train_batch_start, FitTimer.on_train_end = counted_start, counted_end  # type: ignore[method-assign]
    steps: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        logging_overhead.fit(True, 1, Path(tmp) / "warmup")
        for name in LABELS:
            label[0] = name
            logging_overhead.fit(name == "mlflow", epochs, Path(tmp) / name)
            steps[name] = int(FitTimer.last["steps"])
    return steps


def hooked_fits(variants: tuple[str, ...], epochs: int, epoch_start: Callable[[int], None],
                batch_end: Callable[[int, int, int], None], recipe_args: list[str] | None = None) -> dict[str, int]:
    """Run each of ``variants`` (``LOOP_VARIANTS``' names, or ``nomlflow``: the recipe without a logger) once on the
    spiral MLP with two hooks at the places where ``overhead.py`` times: ``epoch_start(epoch)`` where it starts an
    epoch's clock (Lightning: after the ``LoopTimer``'s ``on_train_epoch_start``; the seeds' loop: its clock reading
    at the epoch's start), and ``batch_end(epoch, index, batches)`` after each training batch (Lightning: before the
    ``LoopTimer``'s ``on_train_batch_end``; the seeds' loop: after its ``scheduler.step``, the batch's last call).
    ``recipe_args`` go to the recipe's command line. Returns each variant's training steps in epochs 2.."""
    import _common
    import overhead
    from _common import LoopTimer

    work = overhead.workloads(False)["spiral"]
    start, end, build = LoopTimer.on_train_epoch_start, LoopTimer.on_train_batch_end, overhead.build

    def hooked_start(self: Any, trainer: Any, pl_module: Any) -> None:
        start(self, trainer, pl_module)
        epoch_start(trainer.current_epoch)

    def hooked_end(self: Any, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        batch_end(trainer.current_epoch, batch_idx, trainer.num_training_batches)
        end(self, trainer, pl_module, outputs, batch, batch_idx)

    readings = {"clock": 0, "steps": 0}

    def seeds_clock() -> float:  # run_seeds reads the clock at the start and the end of every epoch
        epoch, ends = divmod(readings["clock"], 2)
        readings["clock"] += 1
        if not ends:
            epoch_start(epoch)
        return _common.clock()

    def seeds_build(work: Any, steps_per_epoch: int, *args: Any, **kwargs: Any) -> Any:
        model, optimizer, scheduler = build(work, steps_per_epoch, *args, **kwargs)
        step = scheduler.step

        def hooked_step(*a: Any, **k: Any) -> None:
            step(*a, **k)
            epoch, index = divmod(readings["steps"], steps_per_epoch)
            readings["steps"] += 1
            batch_end(epoch, index, steps_per_epoch)

        scheduler.step = hooked_step
        return model, optimizer, scheduler

    steps: dict[str, int] = {}
    LoopTimer.on_train_epoch_start, LoopTimer.on_train_batch_end = hooked_start, hooked_end  # type: ignore
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for variant in variants:
                if variant == "seeds":
                    readings["clock"] = readings["steps"] = 0
                    overhead.clock, overhead.build = seeds_clock, seeds_build
                    try:
                        epochs_run = overhead.run_seeds(work, epochs)
                    finally:
                        overhead.clock, overhead.build = _common.clock, build
                elif variant in ("recipe", "nomlflow"):  # nomlflow: overhead.py's, the recipe without a logger
                    extra = [*(recipe_args or []), *(["--trainer.logger", "false"] if variant == "nomlflow" else [])]
                    epochs_run = overhead.run_recipe(work, epochs, Path(tmp) / variant, extra=extra or None)
                else:
                    epochs_run = overhead.run_bare(work, epochs, fused=variant == "barefused")
                steps[variant] = sum(n for epoch, _, _, n in epochs_run if epoch >= 1)
    finally:
        LoopTimer.on_train_epoch_start, LoopTimer.on_train_batch_end = start, end  # type: ignore
    return steps


def loop_windows(switch: Callable[[bool], None], variants: tuple[str, ...] = LOOP_VARIANTS, epochs: int = 6,
                 recipe_args: list[str] | None = None) -> dict[str, int]:
    """Run each of ``variants`` once on the spiral MLP (``hooked_fits``), calling ``switch(True)`` where
    ``overhead.py`` starts its clock for an epoch after the first and ``switch(False)`` after that epoch's last
    training batch (the training batches of epochs 2..); returns each variant's counted training steps. Shared by the
    counted (callgrind) and the cycle-counted (``cycle_counts.py``) runs."""
    counting = {"on": False}

    def epoch_start(epoch: int) -> None:
        if epoch >= 1:
            switch(True)
            counting["on"] = True

    def batch_end(epoch: int, index: int, batches: int) -> None:
        if counting["on"] and index + 1 >= batches:
            switch(False)
            counting["on"] = False

    return hooked_fits(variants, epochs, epoch_start, batch_end, recipe_args)


def counted_loops(epochs: int, dilation: float) -> dict[str, int]:
    """Inside valgrind: each of ``LOOP_VARIANTS`` on the spiral MLP with the training batches of epochs 2.. counted
    (the epochs ``overhead.py`` times), and a calibration window (the switches alone); training steps counted."""
    prepare_counted_process(dilation)

    def switch(on: bool) -> None:
        control("--instr=on" if on else "--instr=off")

    control("--zero")
    for _ in range(epochs - 1):  # the switches alone, as often as a variant's counted epochs
        switch(True)
        switch(False)
    control("--dump=calibration")
    steps: dict[str, int] = {}
    interval = ["--system_metrics_interval", str(SYSTEM_METRICS * dilation)]
    for variant in LOOP_VARIANTS:
        control("--zero")
        steps.update(loop_windows(switch, (variant,), epochs, recipe_args=interval))
        control(f"--dump={variant}")
    return steps


POSITIONS = ("first", "middle", "last")  # batch 0, batches 1..N-2, batch N-1 of an epoch


def counted_positions(epochs: int, dilation: float) -> dict[str, Any]:
    """Inside valgrind: ``seeds``, ``barefused`` and ``recipe`` on the spiral MLP (``hooked_fits``), simulated without
    a break from the end of epoch 1's training batches to the end of the fit (so that the cache model sees what
    validation, checkpoints and logging leave behind), and dumped at every epoch's start (``gap``: what ran since the
    previous epoch's last batch) and after its first, last-but-one and last batch (``POSITIONS``), epochs 2..
    counted; a calibration of the dumps alone. Returns the batches per epoch of each variant."""
    prepare_counted_process(dilation)
    state: dict[str, Any] = {"variant": "", "epoch": 0}

    def mark(label: str) -> None:  # the counts since the previous mark, under this label (callgrind zeroes them)
        control(f"--dump={state['variant']}.{state['epoch']}.{label}")

    def epoch_start(epoch: int) -> None:
        state["epoch"] = epoch
        if epoch >= 1:
            mark("gap")

    def batch_end(epoch: int, index: int, batches: int) -> None:
        state["batches"] = batches
        if epoch == 0 and index + 1 == batches:
            control("--instr=on")
        elif epoch >= 1 and index in (0, batches - 2, batches - 1):
            mark(POSITIONS[0 if index == 0 else 1 if index == batches - 2 else 2])

    state["variant"] = "calibration"
    control("--instr=on")
    for epoch in range(2 * (epochs - 1)):
        state["epoch"] = epoch
        mark("dump")
    control("--instr=off")
    batches: dict[str, Any] = {}
    interval = ["--system_metrics_interval", str(SYSTEM_METRICS * dilation)]
    for variant in ("seeds", "barefused", "recipe"):
        state["variant"] = variant
        hooked_fits((variant,), epochs, epoch_start, batch_end, recipe_args=interval)
        control("--instr=off")
        state["epoch"] = epochs
        mark("end")
        batches[variant] = state["batches"]
    return {"batches": batches}


def report_positions(folder: Path, steps: dict[str, Any], epochs: int,
                     levels: tuple[str, str] = ("L1", "LL")) -> dict[str, Any]:
    """Print and return, per batch position and variant, the training thread's instructions, estimated cycles and
    misses per step (``--simulate``'s events when they were counted), the dumps' own cost subtracted."""
    dumps = dump_files(folder)
    calibration = [threads[1][1] for label, threads in dumps.items()
                   if label.startswith("calibration.") and 1 in threads]
    keys = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw", "Bcm", "Bim")
    base = {k: sorted(e.get(k, 0) for e in calibration)[len(calibration) // 2] for k in keys} if calibration else {}
    figures: dict[str, Any] = {}
    print(f"instruction_counts --question positions: spiral MLP, epochs 2..{epochs}, training thread, per step; "
          f"the cache model ran through validation, checkpoints and logging; each dump's own "
          f"{base.get('Ir', 0):,.0f} instructions subtracted")
    print(f"{'position':>8} {'variant':>9} {'instructions':>13} {'est. cycles':>12} {levels[0] + ' misses':>12} "
          f"{levels[1] + ' misses':>12} {'mispredicts':>11}")
    for position in (*POSITIONS, "epoch", "gap"):
        for variant, batches in steps["batches"].items():
            per_batch = {"first": 1, "middle": batches - 2, "last": 1, "epoch": batches, "gap": 1}[position]
            labels = POSITIONS if position == "epoch" else (position,)
            total = {k: 0.0 for k in keys}
            windows = 0
            for epoch in range(1, epochs):
                for label in labels:
                    events = dumps.get(f"{variant}.{epoch}.{label}", {}).get(1, (None, {}))[1]
                    windows += 1
                    for k in keys:
                        total[k] += events.get(k, 0) - base.get(k, 0)
            steps_counted = per_batch * (epochs - 1)
            row = {k: v / steps_counted for k, v in total.items()}
            row["cycles"] = estimated_cycles({k: int(v) for k, v in row.items()})
            figures.setdefault(position, {})[variant] = row
            l1 = row["I1mr"] + row["D1mr"] + row["D1mw"]
            ll = row["ILmr"] + row["DLmr"] + row["DLmw"]
            print(f"{position:>8} {variant:>9} {row['Ir']:13,.0f} {row['cycles']:12,.0f} {l1:12,.0f} {ll:12,.0f} "
                  f"{row['Bcm'] + row['Bim']:11,.0f}")
    epoch = figures["epoch"]
    for a, b in (("recipe", "seeds"), ("barefused", "seeds"), ("recipe", "barefused")):
        if a in epoch and b in epoch:
            print(f"{a} / {b}: instructions {epoch[b]['Ir'] / epoch[a]['Ir']:.3f}, estimated cycles "
                  f"{epoch[b]['cycles'] / epoch[a]['cycles']:.3f} (per step of {b} / of {a}, over whole epochs)")
    return {"positions": figures, "epochs": epochs}


def report_loop(counts: dict[str, dict[int, int]], steps: dict[str, int], epochs: int,
                unit: str = "instructions", folder: Path | None = None) -> dict[str, Any]:
    """Print and return the training thread's instructions per training step of each variant, and the ratios."""
    overhead_per_window = counts.get("calibration", {}).get(1, 0) / max(epochs - 1, 1)
    per_step = {}
    for variant in LOOP_VARIANTS:
        total = counts.get(variant, {}).get(1, 0) - overhead_per_window * (epochs - 1)
        per_step[variant] = total / steps[variant]
    print(f"instruction_counts: spiral MLP, training batches of epochs 2..{epochs} (what overhead.py times), "
          f"training thread; the switches' own {overhead_per_window:,.0f} {unit} per epoch subtracted")
    others = {variant: sum(v for k, v in counts.get(variant, {}).items() if k != 1) / steps[variant]
              for variant in LOOP_VARIANTS}
    for variant in LOOP_VARIANTS:
        print(f"  {variant:>9}: {per_step[variant]:12,.0f} {unit} per step ({steps[variant]} steps); other threads "
              f"meanwhile {others[variant]:,.0f}")
    split: dict[str, dict[str, float]] = {}
    if folder is not None and unit == "instructions":
        files = dump_files(folder)
        print("  where they ran, per step (callgrind_annotate's exclusive costs by library):")
        for variant in LOOP_VARIANTS:
            libraries = instructions_by_library(files[variant][1][0])
            split[variant] = {name: count / steps[variant] for name, count in libraries.items()}
            print(f"  {variant:>9}: " + ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in
                                                   sorted(split[variant].items())))
    ratios = {}
    for a, b in (("recipe", "seeds"), ("barefused", "seeds"), ("bare", "seeds"), ("recipe", "barefused"),
                 ("recipe", "bare")):
        ratios[f"{a} / {b}"] = per_step[b] / per_step[a]  # speed ratio at equal instructions per second
        print(f"{a} / {b}: {ratios[f'{a} / {b}']:.3f} ({unit} per step of {b} / of {a})")
    return {"per_step": per_step, "other_threads": others, "ratios": ratios, "epochs": epochs, "unit": unit,
            "by_library": split}


def estimated_cycles(events: dict[str, int]) -> int:
    """Callgrind's cycle estimate (KCachegrind's "CEst"): every instruction one cycle, a mispredicted branch or a
    first-level cache miss 10 more, a last-level miss 100 more (``--simulate``'s cache and branch models)."""
    first_level = events.get("I1mr", 0) + events.get("D1mr", 0) + events.get("D1mw", 0)
    last_level = events.get("ILmr", 0) + events.get("DLmr", 0) + events.get("DLmw", 0)
    return events["Ir"] + 10 * (events.get("Bcm", 0) + events.get("Bim", 0) + first_level) + 100 * last_level


def dump_files(folder: Path) -> dict[str, dict[int, tuple[Path, dict[str, int]]]]:
    """Each labelled dump's files: ``{label: {thread: (file, {event: total})}}`` (thread 1: the main thread)."""
    dumps: dict[str, dict[int, tuple[Path, dict[str, int]]]] = {}
    for path in folder.glob("cg.*"):
        text = path.read_text(errors="replace")
        trigger = re.search(r"^desc: Trigger: dump (\S+)", text, re.M)
        thread = re.search(r"^thread: (\d+)", text, re.M)
        names = re.search(r"^events: (.+)$", text, re.M)
        total = re.search(r"^totals: ([\d ]+)$", text, re.M) or re.search(r"^summary: ([\d ]+)$", text, re.M)
        if trigger and thread and names and total:
            keys, values = names.group(1).split(), [int(v) for v in total.group(1).split()]
            events = dict(zip(keys, values + [0] * (len(keys) - len(values))))
            dumps.setdefault(trigger.group(1), {})[int(thread.group(1))] = (path, events)
    return dumps


def read_dumps(folder: Path, measure: str = "Ir") -> dict[str, dict[int, int]]:
    """Per thread, the count of each labelled dump: ``{label: {thread: count}}`` (thread 1: the main thread);
    ``measure``: "Ir" (instructions) or "cycles" (``estimated_cycles``, from a ``--simulate`` run)."""
    return {label: {thread: estimated_cycles(events) if measure == "cycles" else events["Ir"]
                    for thread, (_, events) in threads.items()}
            for label, threads in dump_files(folder).items()}


# where an instruction ran, by the file callgrind_annotate names for its function
LIBRARIES = (("Python interpreter", ("libpython", "Python-3.")), ("torch (kernels, MKL, dispatch)",
             ("libtorch", "libc10", "/torch/lib/")), ("C library", ("libc.so", "libm.so", "libstdc++", "ld-linux")))


def instructions_by_library(path: Path) -> dict[str, int]:
    """The instructions of one dump file summed by library (``LIBRARIES``, the rest "other"), from
    ``callgrind_annotate``'s exclusive cost per function."""
    listing = subprocess.run(["callgrind_annotate", "--threshold=100", str(path)], capture_output=True, text=True,
                             check=True).stdout
    return sum_by_library(listing)


def sum_by_library(listing: str) -> dict[str, int]:
    """``callgrind_annotate``'s per-function lines summed by ``LIBRARIES`` (the "PROGRAM TOTALS" line left out)."""
    totals: dict[str, int] = {}
    for line in listing.splitlines():
        row = re.match(r"^\s*([\d,]+) \(\s*[\d.]+%\)\s+(.*)$", line)
        if not row or "PROGRAM TOTALS" in row.group(2):
            continue
        where = next((name for name, marks in LIBRARIES if any(m in row.group(2) for m in marks)), "other")
        totals[where] = totals.get(where, 0) + int(row.group(1).replace(",", ""))
    return totals


def report(counts: dict[str, dict[int, int]], steps: dict[str, int], epochs: int,
           unit: str = "instructions") -> dict[str, Any]:
    """Print and return the per-step counts and the ratios."""
    per_step = {}
    for name in LABELS:
        threads = counts.get(name, {})
        main = threads.get(1, 0)
        others = sum(v for k, v in threads.items() if k != 1)
        per_step[name] = {"training_thread": main / steps[name], "other_threads": others / steps[name],
                          "steps": steps[name]}
    m, n = per_step["mlflow"], per_step["none"]
    thread_ratio = n["training_thread"] / m["training_thread"]
    process_ratio = (n["training_thread"] + n["other_threads"]) / (m["training_thread"] + m["other_threads"])
    print(f"instruction_counts: spiral recipe, {epochs} epochs per fit, counted from the first training batch to the "
          "end of training")
    for name in LABELS:
        row = per_step[name]
        print(f"  {name:>6}: {row['training_thread']:12,.0f} {unit} per step on the training thread, "
              f"{row['other_threads']:10,.0f} in other threads ({row['steps']} steps)")
    print(f"training thread, without / with MLflow: {thread_ratio:.4f} (MLflow adds "
          f"{(1 / thread_ratio - 1) * 100:.2f}% to the training thread's {unit}; target: ratio >= 0.95)")
    print(f"all threads, without / with MLflow: {process_ratio:.4f}")
    return {"per_step": per_step, "training_thread_ratio": thread_ratio, "process_ratio": process_ratio,
            "epochs": epochs, "unit": unit}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--question", choices=["logging", "loop", "positions"], default="logging",
                        help="logging: the recipe with MLflow vs without a logger; loop: seeds, bare Lightning, "
                             "recipe; positions: seeds, barefused, recipe by batch position, the cache model "
                             "running between epochs too")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--dilation", type=float, default=25.0,
                        help="valgrind's slowdown: the wall-clock intervals of the logging path are multiplied by it")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--simulate", action="store_true",
                        help="also simulate the caches and branch prediction (about 2x slower) and count estimated "
                             "cycles instead of instructions")
    parser.add_argument("--last-level", metavar="SIZE,ASSOC,LINE",
                        help="with --simulate, the cache callgrind models as the last level (its --LL); callgrind "
                             "models two levels, first and last (by default the L3), so 524288,8,64 makes the "
                             "second level the host's 512 KiB L2 and counts its misses (hits in L3)")
    parser.add_argument("--tlb", action="store_true",
                        help="with --simulate, model the address-translation caches instead of the memory caches: "
                             "4 KiB pages as lines, 64 entries for the first level (instructions and data, fully "
                             "associative) and 2048 for the second (16-way), this EPYC's TLBs; misses are then page "
                             "walks (the estimated cycles mean nothing then)")
    parser.add_argument("--keep", type=Path, help="keep callgrind's files in this folder (for callgrind_annotate)")
    args = parser.parse_args()
    if os.environ.get(INNER):
        if args.question == "loop":
            steps = counted_loops(args.epochs, args.dilation)
        elif args.question == "positions":
            steps = counted_positions(args.epochs, args.dilation)
        else:
            steps = counted_fits(args.epochs, args.dilation)
        Path(os.environ[INNER]).write_text(json.dumps(steps))
        return
    if not (shutil.which("valgrind") and shutil.which("callgrind_control")):
        sys.exit("instruction_counts: needs valgrind (callgrind and callgrind_control): apt install valgrind")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) if args.keep is None else args.keep
        folder.mkdir(parents=True, exist_ok=True)
        steps_file = folder / "steps.json"
        simulate = ["--cache-sim=yes", "--branch-sim=yes"] if args.simulate else []
        if args.simulate and args.last_level:
            simulate.append(f"--LL={args.last_level}")
        if args.simulate and args.tlb:
            simulate += ["--I1=262144,64,4096", "--D1=262144,64,4096", "--LL=8388608,16,4096"]
        command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes", *simulate,
                   f"--callgrind-out-file={folder}/cg.%p", sys.executable, __file__, "--question", args.question,
                   "--epochs", str(args.epochs), "--dilation", str(args.dilation)]
        with open(folder / "valgrind.log", "w") as log:
            done = subprocess.run(command, env={**os.environ, INNER: str(steps_file)}, stdout=log, stderr=log)
        if done.returncode != 0 or not steps_file.exists():
            sys.exit(f"instruction_counts: the run under valgrind failed (exit {done.returncode}):\n"
                     + (folder / "valgrind.log").read_text()[-3000:])
        counts = read_dumps(folder, "cycles" if args.simulate else "Ir")
        unit = "estimated cycles" if args.simulate else "instructions"
        steps = json.loads(steps_file.read_text())
        if args.question == "positions":
            levels = ("L1 TLB", "L2 TLB") if args.tlb else ("L1", "L2" if args.last_level else "LL")
            figures = report_positions(folder, steps, args.epochs, levels)
        elif args.question == "loop":
            figures = report_loop(counts, steps, args.epochs, unit, folder)
        else:
            figures = report(counts, steps, args.epochs, unit)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
