"""What MLflow tracking costs a recipe: the spiral recipe with the default MLflow logger vs with no logger, and
what MLflow's system metrics add on top.

    python benchmarks/logging_overhead.py [--repeats 20] [--epochs 40] [--threads N] [--system-metrics-interval S]
                                          [--json PATH]
    python benchmarks/logging_overhead.py --quick     # 2 rounds of 3 epochs: checks that it runs (no verdict to trust)

The variants: ``mlflow`` (the logger, system metrics off), ``none`` (no logger) and ``sysmetrics`` (the logger with
MLflow's system metrics sampled every ``--system-metrics-interval`` seconds, default 1: ten times the recipes'
default of 10 s, so a short run takes several samples and the figure is an upper bound). All variants run in this process through ``recipes.cli.main`` (same data, model, optimizer, schedule, clipping,
checkpoints, plan and doctor), in pairs (mlflow, none, then none, mlflow, ...: each pair runs back to back, in
alternating order), each in a fresh temporary directory; with system metrics the three variants rotate (mlflow, none, sysmetrics;
none, sysmetrics, mlflow; ...). Three figures, and the system metrics' ratio (sysmetrics / mlflow loop steps/s,
median of the paired ratios):

* loop: optimizer steps per second from the first training batch to the end of training, validation and
  checkpoint writes included (what logging costs while training: step and epoch metrics, the LR monitor,
  checkpoint uploads). The ratio is the median over the pairs of (MLflow run / no-logger run), printed with a
  bootstrap 90% interval: single runs of the same variant differ by 10-20% on a shared 2-core machine, so one
  pair, or a handful, cannot resolve a 5% effect. Target: MLflow costs at most 5% (median ratio >= 0.95);
* direct cost: the training thread's seconds inside MLflow logging calls during the loop (``log_metrics``, the
  checkpoint hand-off to the uploader, the LR monitor's hooks, the checkpoint stamp's work for the run at every save:
  the journal's fsync, holding the metrics for the writer thread, the checkpoint-step tag) as a share of the loop's time, which does not
  depend on the machine's noise; what it leaves out is what background threads (MLflow's writer, the checkpoint
  uploader) take from the training thread through Python's GIL and the cores;
* run: wall time of the whole ``recipes fit`` call, including the per-run fixed costs that only the MLflow variant
  pays (opening the store, creating the run, the config artifact, the confusion-matrix plot, ending the run),
  printed so that those costs stay visible.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any, Callable
from _common import REPO, FitTimer, in_directory, median, quiet, recipe_thread_args, set_threads

TARGET = 0.95
DIRECT_SECONDS = [0.0]  # training-thread seconds inside MLflow logging calls while the loop runs
_DEPTH = [0]  # timed calls in progress (the LR monitor's hook calls log_metrics: only the outer one counts)


def timed(method: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` with its wall time added to ``DIRECT_SECONDS`` while a loop is being timed (between the first
    training batch and the end of training); calls made inside another timed call are not counted twice."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _DEPTH[0] or "start" not in FitTimer.last or "seconds" in FitTimer.last:
            return method(*args, **kwargs)
        _DEPTH[0] += 1
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            DIRECT_SECONDS[0] += time.perf_counter() - start
            _DEPTH[0] -= 1

    return wrapper


def instrument() -> None:
    """Time the training thread's MLflow logging calls: metrics, checkpoint hand-off, the LR monitor's hooks, and
    what the run's checkpoint stamp does for the run at every save (the journal's fsync, holding the metrics, the
    newest checkpoint's step tag)."""
    from lightning.pytorch.callbacks import LearningRateMonitor

    from recipes.callbacks.run_continuity import RunContinuity
    from recipes.tracking.logger import RecipeLogger

    for cls, names in ((RecipeLogger, ("log_metrics", "after_save_checkpoint")),
                       (LearningRateMonitor, ("on_train_batch_start", "on_train_epoch_start")),
                       (RunContinuity, ("on_save_checkpoint", "tag_checkpoint_step"))):
        for name in names:
            setattr(cls, name, timed(getattr(cls, name)))


def fit(logger: bool, epochs: int, workdir: Path, system_metrics: float = 0.0) -> tuple[float, float, float, dict]:
    """One in-process ``recipes fit`` of the spiral recipe in ``workdir``: (whole-run seconds, loop steps/s,
    share of the loop's time spent inside MLflow logging calls on the training thread, the loop's steps per second of
    CPU time: ``{"thread": ..., "process": ...}``). ``system_metrics``: seconds between MLflow's system-metrics samples
    (0: off)."""
    from recipes.cli import main

    args = ["fit", "-c", str(REPO / "configs" / "spiral_mlp.yaml"), "--trainer.max_epochs", str(epochs)]
    args += ["--trainer.callbacks+=_common.FitTimer", "--system_metrics_interval", str(system_metrics),
             *recipe_thread_args()]
    if not logger:
        args += ["--trainer.logger", "false"]
    FitTimer.last = {}
    DIRECT_SECONDS[0] = 0.0
    with in_directory(workdir), quiet():
        start = time.perf_counter()
        main(args)
        seconds = time.perf_counter() - start
    loop, steps = FitTimer.last["seconds"], FitTimer.last["steps"]
    cpu = {"thread": steps / FitTimer.last["thread_seconds"], "process": steps / FitTimer.last["process_seconds"]}
    return seconds, steps / loop, DIRECT_SECONDS[0] / loop, cpu


def bootstrap_interval(values: list[float], level: float = 0.9, draws: int = 5000) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (seeded: the same values give the same interval)."""
    rng = random.Random(0)
    medians = sorted(median(rng.choices(values, k=len(values))) for _ in range(draws))
    tail = int(draws * (1 - level) / 2)
    return medians[tail], medians[draws - 1 - tail]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="pairs of runs (MLflow, no logger)")
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--system-metrics-interval", type=float, default=1.0,
                        help="seconds between system-metrics samples in the sysmetrics variant (0: no such variant)")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--quick", action="store_true", help="2 rounds of 3 epochs (checks that it runs)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.epochs = 2, 3
    set_threads(args.threads)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    instrument()
    variants = ["mlflow", "none"] + (["sysmetrics"] if args.system_metrics_interval > 0 else [])
    runs: dict[str, list[float]] = {name: [] for name in variants}
    loops: dict[str, list[float]] = {name: [] for name in variants}
    direct: list[float] = []
    cpu: dict[str, dict[str, list[float]]] = {name: {"thread": [], "process": []} for name in variants}
    # every run gets its own directory (its own mlflow.db); all are removed only at the end, because MLflow keeps
    # its SQLite engines cached for the life of the process
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fit(True, 1, root / "warmup")  # imports, MLflow schema creation, torch kernels
        for i in range(args.repeats):
            if len(variants) == 2:
                order = variants if i % 2 == 0 else variants[::-1]
            else:
                order = variants[i % 3:] + variants[:i % 3]
            for name in order:
                interval = args.system_metrics_interval if name == "sysmetrics" else 0.0
                seconds, rate, share, per_cpu = fit(name != "none", args.epochs, root / f"{name}-{i}", interval)
                for clock_name, value in per_cpu.items():
                    cpu[name][clock_name].append(value)
                runs[name].append(seconds)
                loops[name].append(rate)
                if name == "mlflow":
                    direct.append(share)
    for name in variants:
        rates = ", ".join(f"{r:.0f}" for r in loops[name])
        print(
            f"{name:>7}: loop median {median(loops[name]):7.1f} steps/s (runs: {rates});  "
            f"whole run median {median(runs[name]):6.2f} s"
        )
    paired = [m / n for m, n in zip(loops["mlflow"], loops["none"])]
    ratio = median(paired)
    low, high = bootstrap_interval(paired) if len(paired) > 1 else (ratio, ratio)
    verdict = "meets" if ratio >= TARGET else "misses"
    print(f"loop steps/s with MLflow / without: {ratio:.3f} (median of {len(paired)} pairs, 90% interval "
          f"{low:.3f}-{high:.3f}; ratio of the medians {median(loops['mlflow']) / median(loops['none']):.3f}) "
          f"({verdict} the >= {TARGET} target)")
    cpu_ratios = {}
    for clock_name, what in (("thread", "the training thread's CPU time"),
                             ("process", "the process's CPU time, background threads included")):
        pairs = [m / n for m, n in zip(cpu["mlflow"][clock_name], cpu["none"][clock_name])]
        cpu_ratios[clock_name] = median(pairs)
        print(f"loop steps per second of {what}, with MLflow / without: {cpu_ratios[clock_name]:.3f} (median of "
              f"{len(pairs)} pairs)")
    share = median(direct)
    print(f"training-thread time inside MLflow logging calls: {share:.1%} of the loop (median)")
    run_ratio = median(runs["none"]) / median(runs["mlflow"])
    print(f"whole-run speed with MLflow / without (incl. per-run fixed costs): {run_ratio:.3f}")
    system: dict[str, Any] = {}
    if "sysmetrics" in variants:
        with_system = [m / n for m, n in zip(loops["sysmetrics"], loops["mlflow"])]
        system_ratio = median(with_system)
        low_s, high_s = bootstrap_interval(with_system) if len(with_system) > 1 else (system_ratio, system_ratio)
        print(f"loop steps/s with system metrics every {args.system_metrics_interval:g} s / without: "
              f"{system_ratio:.3f} (median of {len(with_system)} pairs, 90% interval {low_s:.3f}-{high_s:.3f})")
        system = {"system_metrics_interval": args.system_metrics_interval, "system_metrics_ratio": system_ratio,
                  "system_metrics_interval_90": [low_s, high_s], "system_metrics_paired_ratios": with_system}
    if args.json:
        args.json.write_text(json.dumps({**system,
            "benchmark": "logging_overhead", "pairs": len(paired), "epochs": args.epochs,
            "loop_ratio": ratio, "interval": [low, high], "target": TARGET, "met": ratio >= TARGET,
            "direct_share": share, "cpu_time_ratios": cpu_ratios, "whole_run_ratio": run_ratio,
            "steps_per_s": {k: median(v) for k, v in loops.items()}, "paired_ratios": paired,
        }, indent=2))


if __name__ == "__main__":
    main()
