"""What MLflow tracking costs a recipe: the spiral recipe with the default MLflow logger vs with no logger.

    python benchmarks/logging_overhead.py [--repeats 3] [--epochs 40]

Both variants run in this process through ``recipes.cli.main`` (same data, model, optimizer, schedule, clipping,
checkpoints, plan and doctor), interleaved (mlflow, none, mlflow, none, ...), each in a fresh temporary
directory. Two figures per variant, medians over the repetitions:

* loop: optimizer steps per second from the first training batch to the end of the last epoch (what logging costs
  while training: metrics, LR monitor, checkpoint uploads); target: MLflow costs at most 5% (ratio >= 0.95);
* run: wall time of the whole ``recipes fit`` call, including the per-run fixed costs that only the MLflow variant
  pays (run creation, config and checkpoint artifacts, confusion-matrix plot, ending the run), printed so
  those costs stay visible.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

REPO = Path(__file__).resolve().parents[1]


class LoopTimer(Callback):
    """Seconds from the first training batch to the end of the last training epoch, and the steps taken."""

    last: dict[str, float] = {}

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if "start" not in LoopTimer.last:
            LoopTimer.last["start"] = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        LoopTimer.last["seconds"] = time.perf_counter() - LoopTimer.last["start"]
        LoopTimer.last["steps"] = trainer.global_step


def fit_seconds(logger: bool, epochs: int, workdir: Path) -> tuple[float, float]:
    """One in-process ``recipes fit`` of the spiral recipe in ``workdir`` (created): (run seconds, loop steps/s)."""
    from recipes.cli import main

    args = ["fit", "-c", str(REPO / "configs" / "spiral_mlp.yaml"), "--trainer.max_epochs", str(epochs)]
    args += ["--trainer.callbacks+=__main__.LoopTimer"]
    if not logger:
        args += ["--trainer.logger", "false"]
    LoopTimer.last = {}
    old = Path.cwd()
    workdir.mkdir(parents=True)
    os.chdir(workdir)
    try:
        start = time.perf_counter()
        with redirect_stdout(StringIO()):
            main(args)
        return time.perf_counter() - start, LoopTimer.last["steps"] / LoopTimer.last["seconds"]
    finally:
        os.chdir(old)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=40)
    args = parser.parse_args()
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    # every run gets its own directory (its own mlflow.db); all are removed only at the end, because MLflow keeps
    # its SQLite engines cached for the life of the process
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fit_seconds(True, 1, root / "warmup")  # imports, MLflow schema creation, torch kernels
        runs: dict[str, list[float]] = {"mlflow": [], "none": []}
        loops: dict[str, list[float]] = {"mlflow": [], "none": []}
        for i in range(args.repeats):
            for name in ("mlflow", "none"):
                seconds, rate = fit_seconds(name == "mlflow", args.epochs, root / f"{name}-{i}")
                runs[name].append(seconds)
                loops[name].append(rate)
    for name in ("mlflow", "none"):
        rates = ", ".join(f"{r:.0f}" for r in loops[name])
        print(
            f"{name:>7}: loop median {statistics.median(loops[name]):7.1f} steps/s (runs: {rates});  "
            f"whole run median {statistics.median(runs[name]):6.2f} s"
        )
    ratio = statistics.median(loops["mlflow"]) / statistics.median(loops["none"])
    verdict = "meets" if ratio >= 0.95 else "misses"
    print(f"loop steps/s with MLflow / without: {ratio:.3f} ({verdict} the >= 0.95 target)")
    run_ratio = statistics.median(runs["none"]) / statistics.median(runs["mlflow"])
    print(f"whole-run speed with MLflow / without (incl. per-run fixed costs): {run_ratio:.3f}")


if __name__ == "__main__":
    main()
