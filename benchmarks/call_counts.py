"""How many Python and C function calls the recipe makes per training step beyond bare Lightning: a count, not a time.

    python benchmarks/call_counts.py                  # the spiral MLP, 4 epochs each
    python benchmarks/call_counts.py --model mlp784 --epochs 3 --top 60
    python benchmarks/call_counts.py --place last     # only the last batch of each epoch (step_positions' parts)
    python benchmarks/call_counts.py --logger-cost    # the recipe with MLflow against no logger, per whole epoch

On a small network the recipe's cost per step beyond bare Lightning is a few hundred small Python calls, each about
1-2 us on a CPU, run between the step's tensor operations. Timings of that size move by more than their own size
between runs on a noisy machine; the number of calls does not move at all. So this script runs one bare-Lightning fit
(with the recipe's fused optimizer kernel: ``overhead.py``'s ``barefused``) and one ``recipes fit`` of the same
workload, counts every function call on the training thread (``sys.setprofile``: Python functions by file and name,
C functions by name) during the training batches of every epoch after the first (as ``step_costs.py`` times them),
and prints the calls per step of both and the functions with the largest difference. The time each call costs is
``step_costs.py``'s business; this is the figure that shows whether a change removed work.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from _common import machine, quiet, set_threads

from overhead import fits_wrapped, run_like_for_like
from step_costs import TIMING, profiler_and_switch
from step_positions import place_of

CALLS: Counter[str] = Counter()
BY_CALLER = {"on": False}
# which batches of an epoch are counted: all, or one place (the first batch, batches 1-5, the middle, the last batch)
PLACE = {"only": "all", "batch": 0, "batches": 0, "steps": 0, "whole_epoch": False, "epochs": 0}


def counting() -> bool:
    if PLACE["only"] == "epoch":
        return bool(PLACE["whole_epoch"])
    return TIMING["on"] and (PLACE["only"] == "all" or place_of(PLACE["batch"], PLACE["batches"]) == PLACE["only"])


def where(frame: Any, event: str, arg: Any) -> str:
    """A call's name: ``path-tail:function`` for Python, ``C name`` for a C function."""
    if event == "c_call":
        owner = getattr(arg, "__self__", None)
        kind = type(owner).__name__ if owner is not None and not isinstance(owner, type(sys)) else ""
        name = f"C {kind + '.' if kind else ''}{getattr(arg, '__name__', repr(arg))}"
        return f"{name} <- {python_name(frame.f_code)}" if BY_CALLER["on"] else name
    name = python_name(frame.f_code)
    caller = frame.f_back
    return f"{name} <- {python_name(caller.f_code)}" if BY_CALLER["on"] and caller is not None else name


def python_name(code: Any) -> str:
    """``path-tail:function`` of a Python function's code."""
    parts = Path(code.co_filename).parts
    tail = "/".join(parts[-3:]) if "site-packages" in parts else "/".join(parts[-2:])
    return f"{tail}:{code.co_qualname}"


def profile(frame: Any, event: str, arg: Any) -> None:
    if event in ("call", "c_call") and counting():
        CALLS[where(frame, event, arg)] += 1


def count(loop: str, epochs: int, workdir: Path, model: str,
          recipe_args: list[str] | None = None) -> tuple[Counter[str], int]:
    """Calls per function during the counted training steps of one fit of ``loop``, and the number of those steps
    (with ``PLACE["only"] == "epoch"``: during every whole epoch after the first, and the number of those epochs)."""
    CALLS.clear()
    TIMING.update(on=False, steps=0)
    _, switch = profiler_and_switch(time_members=False)
    PLACE.update(batch=0, steps=0, whole_epoch=False, epochs=0)

    from lightning.pytorch.callbacks import Callback

    from lightning_modules.compat import skip_batch_hooks

    class Place(Callback):
        """Keeps the index of the running batch (the last callback, so the others' batch-end hooks count for the batch
        that ends)."""

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            PLACE.update(batch=0, batches=trainer.num_training_batches)

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.current_epoch >= 1 and place_of(batch_idx, PLACE["batches"]) == PLACE["only"]:
                PLACE["steps"] += 1
            PLACE["batch"] = batch_idx + 1

    class WholeEpochs(Callback):
        """Counts from each epoch's start after the first (the first callback) to the end of training: the batches,
        the validation, the epoch-end hooks and the checkpoint saves."""

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            if trainer.current_epoch >= 1:
                PLACE["whole_epoch"] = True
                PLACE["epochs"] += 1

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            PLACE["whole_epoch"] = False

    def counted(original_fit: Any) -> Any:
        def fit_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            # only the callbacks the counting needs: each costs calls at every hook, more in bare Lightning (whose
            # default profiler wraps each hook call in a context manager) than in the recipe
            # (and their no-op batch hooks are skipped)
            if PLACE["only"] == "epoch":
                self.callbacks[:0] = [skip_batch_hooks(WholeEpochs())]
            else:
                self.callbacks += [switch] if PLACE["only"] == "all" else [switch, skip_batch_hooks(Place())]
            sys.setprofile(profile)
            try:
                return original_fit(self, *args, **kwargs)
            finally:
                sys.setprofile(None)

        return fit_counted

    with fits_wrapped(counted):
        run_like_for_like(loop, model, epochs, workdir, recipe_args)
    counted_units = {"all": TIMING["steps"], "epoch": PLACE["epochs"]}.get(PLACE["only"], PLACE["steps"])
    return Counter(CALLS), max(1, counted_units)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per fit (the first is not counted)")
    parser.add_argument("--top", type=int, default=40, help="functions to print")
    parser.add_argument("--by-caller", action="store_true", help="name each call with the Python function calling it")
    parser.add_argument("--model", choices=["spiral", "mlp784"], default="spiral", help="overhead.py's workload")
    parser.add_argument("--place", choices=["all", "first", "early", "middle", "last"], default="all",
                        help="count only the first batch of each epoch, batches 1-5, 6 to the last but one, or the last")
    parser.add_argument("--logger-cost", action="store_true",
                        help="count the recipe with its MLflow logger against the recipe with --trainer.logger false, "
                             "over whole epochs (batches, validation, epoch ends, checkpoint saves), per epoch")
    args = parser.parse_args(argv)
    set_threads(1)
    BY_CALLER["on"] = args.by_caller
    PLACE["only"] = "epoch" if args.logger_cost else args.place
    where_ = ", whole epochs" if args.logger_cost else "" if args.place == "all" else f", {args.place} batches only"
    print(f"call_counts: {machine()}, {args.model}, {args.epochs} epochs per fit, calls on the training thread{where_}")
    with tempfile.TemporaryDirectory() as tmp, quiet():
        if args.logger_cost:
            names_ = ("none", "mlflow")
            base, base_units = count("recipe", args.epochs, Path(tmp) / "none", args.model, ["--trainer.logger", "false"])
        else:
            names_ = ("bare", "recipe")
            base, base_units = count("bare", args.epochs, Path(tmp) / "bare", args.model)
        other, other_units = count("recipe", args.epochs, Path(tmp) / "recipe", args.model)
    per_base = {k: v / base_units for k, v in base.items()}
    per_other = {k: v / other_units for k, v in other.items()}
    unit = "epoch" if args.logger_cost else "step"

    def total(per: dict[str, float], c: bool) -> float:
        return sum(v for k, v in per.items() if k.startswith("C ") == c)

    a, b_ = names_
    print(f"  counted {unit}s: {a} {base_units}, {b_} {other_units}")
    head = f"{'calls per ' + unit:>15} {a:>8} {b_:>8} {b_ + '-' + a:>11}"
    print(f"\n{head}")
    for c, what in ((False, "Python functions"), (True, "C functions")):
        x, y = total(per_base, c), total(per_other, c)
        print(f"{'':>15} {x:8.1f} {y:8.1f} {y - x:+11.1f}  {what}")
    names = sorted(set(per_base) | set(per_other), key=lambda n: -abs(per_other.get(n, 0) - per_base.get(n, 0)))
    print(f"\n{head}  function (the largest differences)")
    for name in names[: args.top]:
        x, y = per_base.get(name, 0.0), per_other.get(name, 0.0)
        print(f"{'':>15} {x:8.2f} {y:8.2f} {y - x:+11.2f}  {name}")


if __name__ == "__main__":
    sys.exit(main())
