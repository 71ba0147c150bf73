"""Where the recipe's time per training step goes beyond bare Lightning, measured inside the loop.

    python benchmarks/step_costs.py                    # the spiral MLP, 3 rounds of 40 epochs each
    python benchmarks/step_costs.py --epochs 80 --rounds 5 --top 40
    python benchmarks/step_costs.py --model mlp784 --epochs 8 --rounds 2

One bare-Lightning fit and one ``recipes fit`` of the same model, data, optimizer (with the kernel the recipe picks,
torch's fused AdamW: ``overhead.py``'s ``barefused``), schedule and clipping as ``overhead.py`` (the spiral MLP, or ``--model mlp784``; 1 torch thread), each with a profiler (Lightning's public ``Profiler`` interface) that times every
action Lightning names around a hook (``[Callback]CallbackGroup.on_train_batch_start``,
``[LightningModule]ClassificationModule.optimizer_step``, ``[Strategy]SingleDeviceStrategy.training_step``, ...) with
the training thread's CPU clock, plus the members of the recipe's callback group one by one and the recipe's own
costly calls (the training metrics' update, ``log_dict``, the loop doctor's read). Only the training batches of the
epochs after the first are counted (validation and checkpoints are not), as in ``overhead.py``. The two fits run in
interleaved rounds, and each row is its least cost over the rounds: a noisy machine only adds time.

The table gives microseconds per training step for both loops and their difference. Actions nest (an optimizer step
holds the training step, the backward and the callbacks' hooks around them), so the rows do not add up; read each
against its bare counterpart. cProfile inflates small Python functions about tenfold; these timers add about a
microsecond per call.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import machine, quiet, set_threads

from overhead import fits_wrapped, run_like_for_like

SECONDS: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
TIMING = {"on": False, "steps": 0}

# the recipe's own calls worth a row of their own: (label, "module:Class.method")
RECIPE_CALLS = (
    ("training metrics: update (DeferredMetricUpdates.flush)", "lightning_modules.deferred_metric_updates:DeferredMetricUpdates.flush"),
    ("metrics handed to self.log (log_dict, once an epoch)", "lightning.pytorch.core.module:LightningModule.log_dict"),
    ("loop doctor: read of the kept steps", "recipes.doctor.current_step:CurrentStep.read"),
    ("train/loss at read steps (TrainStepLogging.step_read)", "lightning_modules.train_step_logging:TrainStepLogging.step_read"),
    ("the network and the loss (forward_batch)", "lightning_modules.classification:ClassificationModule.forward_batch"),
)


def timed(label: str, call: Callable[..., Any]) -> Callable[..., Any]:
    """``call``, its thread CPU time added to ``label`` while the timed batches run."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if not TIMING["on"]:
            return call(*args, **kwargs)
        start = time.thread_time()
        try:
            return call(*args, **kwargs)
        finally:
            SECONDS[label] += time.thread_time() - start
            CALLS[label] += 1

    return run


def patch_recipe_calls() -> Callable[[], None]:
    """Time ``RECIPE_CALLS``; returns the function that puts them back."""
    undo = []
    for label, target in RECIPE_CALLS:
        module_name, _, path = target.partition(":")
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        original = owner.__dict__[name]
        setattr(owner, name, timed(label, original))
        undo.append((owner, name, original))
    return lambda: [setattr(owner, name, original) for owner, name, original in undo]


def profiler_and_switch(time_members: bool = True) -> tuple[Any, Any]:
    """A profiler timing Lightning's actions, and a callback that turns timing on for the training batches of every
    epoch after the first (and, with ``time_members``, wraps the callback group's members, whose hooks the group calls
    itself)."""
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.profilers import Profiler

    class ThreadTimeProfiler(Profiler):
        def __init__(self) -> None:
            super().__init__()
            self.started: dict[str, float] = {}

        def start(self, action_name: str) -> None:
            if TIMING["on"]:
                self.started[action_name] = time.thread_time()

        def stop(self, action_name: str) -> None:
            began = self.started.pop(action_name, None)
            if began is not None:
                SECONDS[action_name] += time.thread_time() - began
                CALLS[action_name] += 1

        def summary(self) -> str:
            return ""

    class TimedBatches(Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            for callback in trainer.callbacks if time_members else ():
                calls = getattr(callback, "hook_calls", None)
                if not isinstance(calls, dict):
                    continue
                for hook, members in calls.items():
                    calls[hook] = tuple(
                        timed(f"  group member {type(getattr(m, '__self__', m)).__name__}.{hook}", m) for m in members
                    )

        def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
            TIMING["on"] = trainer.current_epoch >= 1

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if TIMING["on"]:
                TIMING["steps"] += 1
            if batch_idx + 1 >= trainer.num_training_batches:
                TIMING["on"] = False

    return ThreadTimeProfiler(), TimedBatches()


def measure(loop: str, epochs: int, workdir: Path, model: str = "spiral") -> dict[str, float]:
    """Microseconds per timed training step of every action and call, for ``loop`` ("bare" or "recipe")."""
    SECONDS.clear()
    CALLS.clear()
    TIMING.update(on=False, steps=0)
    profiler, switch = profiler_and_switch()

    def with_timers(original_fit: Any) -> Any:
        def fit_with_timers(self: Any, *args: Any, **kwargs: Any) -> Any:
            self.callbacks.append(switch)
            self.profiler = profiler
            return original_fit(self, *args, **kwargs)

        return fit_with_timers

    undo = patch_recipe_calls() if loop == "recipe" else (lambda: None)
    try:
        with fits_wrapped(with_timers):
            run_like_for_like(loop, model, epochs, workdir)  # bare: the recipe's kernel, like for like
    finally:
        undo()
    steps = max(1, TIMING["steps"])
    return {name: 1e6 * seconds / steps for name, seconds in SECONDS.items()}


def common_name(action: str) -> str:
    """An action named the same for both loops (the module's class and the strategy's differ); the callback group
    without its members' names and a checkpoint without its identity (both are in the ``state_key``)."""
    for prefix in ("[LightningModule]", "[Strategy]"):
        if action.startswith(prefix):
            return prefix + action.rsplit(".", 1)[-1]
    callback = "[Callback]"
    if action.startswith(callback):
        owner, _, hook = action[len(callback):].rpartition(".")
        return f"{callback}{owner.split('[')[0].split('{')[0]}.{hook}"
    return action


def least(rounds: list[dict[str, float]]) -> dict[str, float]:
    """Each action's least cost over the rounds (0 where a round lacks it)."""
    names = {name for costs in rounds for name in costs}
    return {name: min(costs.get(name, 0.0) for costs in rounds) for name in names}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=40, help="epochs per fit (the first is not timed)")
    parser.add_argument("--top", type=int, default=45, help="rows to print")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved bare and recipe fits")
    parser.add_argument("--model", choices=["spiral", "mlp784"], default="spiral", help="overhead.py's workload")
    args = parser.parse_args(argv)
    import torch

    set_threads(1)
    torch.use_deterministic_algorithms(True)  # the spiral recipe sets deterministic: true
    print(f"step_costs: {machine()}, training thread's CPU time, {args.model}, {args.epochs} epochs per fit")
    rounds: dict[str, list[dict[str, float]]] = {"bare": [], "recipe": []}
    with tempfile.TemporaryDirectory() as tmp, quiet():
        run_like_for_like("recipe", args.model, 2, Path(tmp) / "warmup")
        for round_ in range(args.rounds):  # interleaved; each figure is its least over the rounds (noise only adds)
            for loop in ("bare", "recipe"):
                costs = measure(loop, args.epochs, Path(tmp) / f"{loop}-{round_}", args.model)
                rounds[loop].append({common_name(k): v for k, v in costs.items()})
    bare, recipe = (least(rounds[loop]) for loop in ("bare", "recipe"))
    print(f"  the least of {args.rounds} interleaved rounds per row")
    print(f"\n{'us per step':>11} {'bare':>8} {'recipe':>8} {'recipe-bare':>11}  action or call")
    names = sorted(set(bare) | set(recipe), key=lambda n: -(recipe.get(n, 0.0) - bare.get(n, 0.0)))
    top = [n for n in names if "run_training_epoch" not in n][: args.top]
    for name in sorted(top, key=lambda n: -max(recipe.get(n, 0.0), bare.get(n, 0.0))):
        b, r = bare.get(name, 0.0), recipe.get(name, 0.0)
        print(f"{'':>11} {b:8.1f} {r:8.1f} {r - b:+11.1f}  {name}")
    totals = {"run_training_batch": "run_training_batch: a training batch, what overhead.py times",
              "run_training_epoch": "run_training_epoch: with the epoch-end validation and checkpoints (bare has none)"}
    for name, what in totals.items():
        if name in bare or name in recipe:
            b, r = bare.get(name, 0.0), recipe.get(name, 0.0)
            print(f"{'total':>11} {b:8.1f} {r:8.1f} {r - b:+11.1f}  {what}; recipe / bare {b / r if r else 0:.3f}")


if __name__ == "__main__":
    sys.exit(main())
