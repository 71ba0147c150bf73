"""Where in an epoch the recipe's time per step beyond bare Lightning goes: each batch position, side by side.

    python benchmarks/step_positions.py                    # the spiral MLP, 5 interleaved rounds of 8 epochs
    python benchmarks/step_positions.py --rounds 7 --epochs 10
    python benchmarks/step_positions.py --model mlp784 --rounds 3 --epochs 4

One bare-Lightning fit (with the recipe's fused optimizer kernel: ``overhead.py``'s ``barefused``, like for like)
and one ``recipes fit`` of the same workload per round (1 torch thread), in interleaved rounds. A callback times every
training batch of the epochs after the first from the previous batch's end (the epoch's start for batch 0) to its
own end, with the training thread's CPU clock and the wall clock: the fetch, the hooks, the step and whatever the
epoch's first batch does after the epoch-start hooks. Each position's figure is the median over every timed epoch
of every round.

The table shows what a per-step count or a per-step average cannot: which costs come once an epoch (the first
batch: the epoch-start hooks and the caches that validation and the checkpoint writes left cold; the last: the
epoch's deferred training-metric update and the loop doctor's read) and which every step (the recipe's callbacks and bookkeeping). When the wall
clock exceeds the thread's CPU time, the training thread waited: for the GIL, held by a background thread
(checkpoint uploads, MLflow's writer), or for the machine. On a small network the epoch's edges weigh as much as
its middle, so both are printed as shares of the recipe's extra time per epoch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import machine, quiet, set_threads

from overhead import fits_wrapped, run_like_for_like

# (loop, batch index) -> [(thread us, wall us), ...] over every timed epoch
TIMES: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
CURRENT = {"loop": "bare"}


def place_of(batch: int, batches: int) -> str:
    """The part of its epoch the batch with index ``batch`` belongs to: "first", "early" (batches 1-5), "middle" or
    "last" (the parts this script splits the recipe's extra time into; ``call_counts.py --place`` counts one)."""
    if batch == 0:
        return "first"
    if batch == batches - 1:
        return "last"
    return "early" if batch <= 5 else "middle"


def position_timer() -> Any:
    """A callback timing each training batch of the epochs after the first, from the previous batch's end."""
    from lightning.pytorch.callbacks import Callback

    class PositionTimer(Callback):
        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            self.last = (time.thread_time_ns(), time.perf_counter_ns())

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            now = (time.thread_time_ns(), time.perf_counter_ns())
            if trainer.current_epoch >= 1:
                TIMES[(CURRENT["loop"], batch_idx)].append(((now[0] - self.last[0]) / 1e3, (now[1] - self.last[1]) / 1e3))
            self.last = now

    return PositionTimer()


def fit(loop: str, epochs: int, workdir: Path, model: str, recipe_args: list[str] | None = None,
        base: str = "bare") -> None:
    """One fit of ``loop`` ("bare" or "recipe") with the position timer first among its callbacks; the bare loop is
    ``run_like_for_like``'s ``base`` ("bare" or "barecomplete")."""

    def with_timer(original_fit: Any) -> Any:
        def fit_with_timer(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.callbacks.insert(0, position_timer())  # first: the others' batch-end hooks count to the next batch
            return original_fit(self, *args, **kwargs)

        return fit_with_timer

    CURRENT["loop"] = loop
    with fits_wrapped(with_timer):
        run_like_for_like(base if loop == "bare" else loop, model, epochs, workdir, recipe_args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8, help="epochs per fit (the first is not timed)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of one bare and one recipe fit")
    parser.add_argument("--model", choices=["spiral", "mlp784"], default="spiral", help="overhead.py's workload")
    parser.add_argument("--base", choices=["bare", "barecomplete"], default="bare",
                        help="the bare loop: bare Lightning with the recipe's optimizer kernel (overhead.py's "
                             "barefused), or the same with validation and the best checkpoint after every epoch "
                             "(overhead.py's barecomplete: what the recipe does between epochs, Lightning's way)")
    parser.add_argument("--recipe-args", nargs=argparse.REMAINDER, default=[],
                        help="more `recipes fit` arguments (last), e.g. --recipe-args --trainer.limit_val_batches 0")
    args = parser.parse_args(argv)
    set_threads(1)
    print(f"step_positions: {machine()}, {args.model}, {args.rounds} rounds of {args.epochs} epochs per fit, "
          "microseconds from the previous batch's end (medians over the timed epochs)"
          + (f"; recipe with {' '.join(args.recipe_args)}" if args.recipe_args else "")
          + ("; bare = barecomplete (validation and the best checkpoint every epoch)" if args.base == "barecomplete"
             else ""))
    with tempfile.TemporaryDirectory() as tmp, quiet():
        fit("recipe", 2, Path(tmp) / "warmup", args.model)  # imports, MLflow's schema
        TIMES.clear()
        for round_ in range(args.rounds):
            fit("bare", args.epochs, Path(tmp) / f"bare-{round_}", args.model, base=args.base)
            fit("recipe", args.epochs, Path(tmp) / f"recipe-{round_}", args.model, args.recipe_args)
    positions = sorted({i for loop, i in TIMES if loop == "bare"} & {i for loop, i in TIMES if loop == "recipe"})
    med = {key: (statistics.median(t for t, _ in v), statistics.median(w for _, w in v)) for key, v in TIMES.items()}
    print(f"\n{'batch':>5} {'bare cpu':>9} {'wall':>7} {'recipe cpu':>11} {'wall':>7} {'recipe-bare wall':>17}")
    for i in positions:
        (bt, bw), (rt, rw) = med[("bare", i)], med[("recipe", i)]
        print(f"{i:>5} {bt:9.0f} {bw:7.0f} {rt:11.0f} {rw:7.0f} {rw - bw:+17.0f}")

    def extra(idx: list[int]) -> float:
        return sum(med[("recipe", i)][1] - med[("bare", i)][1] for i in idx)

    per_epoch = {loop: sum(med[(loop, i)][1] for i in positions) for loop in ("bare", "recipe")}
    # the sums of the means as well: an epoch now and then much slower than the median (a background thread's
    # burst, the machine) counts in a whole-epoch figure such as overhead.py's, not in the medians
    mean_epoch = {loop: sum(statistics.fmean(w for _, w in TIMES[(loop, i)]) for i in positions)
                  for loop in ("bare", "recipe")}
    total = extra(positions)
    print(f"\nper epoch ({len(positions)} batches, sums of the medians): bare {per_epoch['bare'] / 1e3:.2f} ms, recipe "
          f"{per_epoch['recipe'] / 1e3:.2f} ms (+{total / 1e3:.2f} ms), recipe / bare {per_epoch['bare'] / per_epoch['recipe']:.3f}")
    print(f"per epoch (sums of the means): bare {mean_epoch['bare'] / 1e3:.2f} ms, recipe "
          f"{mean_epoch['recipe'] / 1e3:.2f} ms, recipe / bare {mean_epoch['bare'] / mean_epoch['recipe']:.3f}")
    parts = {place: [i for i in positions if place_of(i, len(positions)) == place]
             for place in ("first", "early", "middle", "last")}
    early, steady = parts["early"], parts["middle"]
    if early:
        rows = [("the first batch (epoch-start hooks; cold caches after validation and checkpoints)", parts["first"]),
                (f"batches {early[0]}-{early[-1]} (the caches warming again)", early)]
        if steady:
            rows.append((f"batches {steady[0]}-{steady[-1]}, {extra(steady) / len(steady):+.0f} us each", steady))
        rows.append(("the last batch (the epoch's deferred metric update, the doctor's read)", parts["last"]))
        for label, idx in rows:
            print(f"  {extra(idx) / 1e3:+7.2f} ms  {100 * extra(idx) / total:5.1f}%  {label}")


if __name__ == "__main__":
    sys.exit(main())
