"""What the task's dispatch shortcuts and the tensor loader's quick pass save: the recipe with and without them.

    python benchmarks/dispatch_costs.py                      # spiral, 7 interleaved repetitions of 10 epochs
    python benchmarks/dispatch_costs.py --quick              # a smoke run (meaningless numbers)

Four variants of the spiral workload run interleaved in one process (``barefused``, ``recipe``, ``without``,
``seeds``, then again), so a slow phase of a shared machine slows all of them:

  barefused  bare Lightning with the recipe's optimizer kernel (``overhead.py``'s variant)
  recipe     ``recipes fit`` as it is
  without    the same recipe with the shortcuts undone in this process: the task's hook-name writes through
             ``nn.Module.__setattr__`` (the mixin's ``__setattr__`` shadowed), the step methods' signatures built by
             ``inspect`` at every batch (their ``__signature__`` removed), the sampler's pass through a Python
             generator that counts each index, and the batch's indices converted by ``torch.as_tensor``
  seeds      the seeds' complete loop (``overhead.py``'s variant)

Printed: samples/s of the training batches of epochs 2..N (thread clock, 1 torch thread) per variant, and the
median of each repetition's own ratios (recipe / without, recipe / barefused, without / barefused, recipe / seeds).
A micro-benchmark of the tensor loader alone (22 batches of 64 a pass) follows, the two ways, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import machine, set_clock, set_threads, throughput

import overhead


@contextmanager
def shortcuts_undone() -> Iterator[None]:
    """This stop's dispatch and loader shortcuts undone for the block (restored after it)."""
    import torch

    import datamodules.tensor_dataset as tensor_dataset
    from datamodules.samplers import EpochRandomSampler
    from lightning_modules.task import Task

    steps = [getattr(Task, name) for name in ("training_step", "validation_step", "test_step")]
    kept = [step.__signature__ for step in steps]
    quick_pass, index_tensor = EpochRandomSampler.__iter__, tensor_dataset.index_tensor

    def counting_pass(self: Any) -> Iterator[int]:  # the pass before this stop: Python steps per index, counting it
        self.counted = 0
        for index in quick_pass(self):
            self.counted += 1
            yield index

    Task.__setattr__ = torch.nn.Module.__setattr__  # type: ignore[method-assign, assignment]
    for step in steps:
        del step.__signature__
    EpochRandomSampler.__iter__ = counting_pass  # type: ignore[method-assign]
    tensor_dataset.index_tensor = lambda indices: torch.as_tensor(indices, dtype=torch.long)
    try:
        yield
    finally:
        del Task.__setattr__  # the mixin's again
        for step, signature in zip(steps, kept):
            step.__signature__ = signature
        EpochRandomSampler.__iter__ = quick_pass  # type: ignore[method-assign]
        tensor_dataset.index_tensor = index_tensor


def loader_pass_us(loader: Any, passes: int) -> float:
    """Microseconds per batch of ``passes`` passes over ``loader`` (wall clock)."""
    start = time.perf_counter()
    batches = 0
    for epoch in range(passes):
        loader.sampler.set_epoch(epoch)
        for _ in loader:
            batches += 1
    return (time.perf_counter() - start) / batches * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="1 repetition of 2 epochs")
    args = parser.parse_args(argv)
    repeats, epochs = (1, 2) if args.quick else (args.repeats, args.epochs)
    set_threads(1)
    set_clock("thread")
    print(f"dispatch_costs: {machine()}, spiral, {repeats} repetitions of {epochs} epochs, thread clock")
    work = overhead.workloads(False)["spiral"]
    rates: dict[str, list[float]] = {name: [] for name in ("barefused", "recipe", "without", "seeds")}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            for name in rates:
                if name == "barefused":
                    runs = overhead.run_bare(work, epochs, fused=True)
                elif name == "seeds":
                    runs = overhead.run_seeds(work, epochs)
                elif name == "recipe":
                    runs = overhead.run_recipe(work, epochs, Path(tmp) / f"{name}{repeat}", ["--torch_threads", "1"])
                else:
                    with shortcuts_undone():
                        runs = overhead.run_recipe(work, epochs, Path(tmp) / f"{name}{repeat}",
                                                   ["--torch_threads", "1"])
                rates[name].append(throughput(runs)[0])
            print(f"  rep {repeat + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in rates.items()),
                  flush=True)
    print("\nsamples/s (median): " + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in rates.items()))
    for a, b in (("recipe", "without"), ("recipe", "barefused"), ("without", "barefused"), ("recipe", "seeds"),
                 ("without", "seeds")):
        paired = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
        of_medians = statistics.median(rates[a]) / statistics.median(rates[b])
        print(f"{a} / {b}: paired {paired:.3f} (ratio of the medians {of_medians:.3f})")

    data = work.make_data()
    data.setup("fit")
    loader = data.train_dataloader()
    quick_us: list[float] = []
    without_us: list[float] = []
    for _ in range(3 if args.quick else 15):
        quick_us.append(loader_pass_us(loader, 2 if args.quick else 20))
        with shortcuts_undone():
            without_us.append(loader_pass_us(loader, 2 if args.quick else 20))
    print(f"tensor loader, us per batch of 64 (median, min): quick pass {statistics.median(quick_us):.1f}, "
          f"{min(quick_us):.1f}; without {statistics.median(without_us):.1f}, {min(without_us):.1f}")


if __name__ == "__main__":
    sys.exit(main())
