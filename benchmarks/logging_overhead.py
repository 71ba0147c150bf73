"""What MLflow tracking costs a recipe: the spiral recipe with the default MLflow logger vs with no logger.

    python benchmarks/logging_overhead.py [--repeats 3] [--epochs 40] [--threads N]

Both variants run in this process through ``recipes.cli.main`` (same data, model, optimizer, schedule, clipping,
checkpoints, plan and doctor), interleaved (mlflow, none, mlflow, none, ...), each in a fresh temporary
directory. Two figures per variant, medians over the repetitions:

* loop: optimizer steps per second from the first training batch to the end of training, validation and
  checkpoint writes included (what logging costs while training: step and epoch metrics, the LR monitor,
  checkpoint uploads); target: MLflow costs at most 5% (ratio >= 0.95);
* run: wall time of the whole ``recipes fit`` call, including the per-run fixed costs that only the MLflow variant
  pays (opening the store, creating the run, the config artifact, the confusion-matrix plot, ending the run),
  printed so that those costs stay visible.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from _common import REPO, FitTimer, in_directory, median, quiet, set_threads


def fit(logger: bool, epochs: int, workdir: Path) -> tuple[float, float]:
    """One in-process ``recipes fit`` of the spiral recipe in ``workdir``: (whole-run seconds, loop steps/s)."""
    from recipes.cli import main

    args = ["fit", "-c", str(REPO / "configs" / "spiral_mlp.yaml"), "--trainer.max_epochs", str(epochs)]
    args += ["--trainer.callbacks+=_common.FitTimer"]
    if not logger:
        args += ["--trainer.logger", "false"]
    FitTimer.last = {}
    with in_directory(workdir), quiet():
        start = time.perf_counter()
        main(args)
        seconds = time.perf_counter() - start
    return seconds, FitTimer.last["steps"] / FitTimer.last["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    set_threads(args.threads)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    # every run gets its own directory (its own mlflow.db); all are removed only at the end, because MLflow keeps
    # its SQLite engines cached for the life of the process
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        fit(True, 1, root / "warmup")  # imports, MLflow schema creation, torch kernels
        runs: dict[str, list[float]] = {"mlflow": [], "none": []}
        loops: dict[str, list[float]] = {"mlflow": [], "none": []}
        for i in range(args.repeats):
            for name in ("mlflow", "none"):
                seconds, rate = fit(name == "mlflow", args.epochs, root / f"{name}-{i}")
                runs[name].append(seconds)
                loops[name].append(rate)
    for name in ("mlflow", "none"):
        rates = ", ".join(f"{r:.0f}" for r in loops[name])
        print(
            f"{name:>7}: loop median {median(loops[name]):7.1f} steps/s (runs: {rates});  "
            f"whole run median {median(runs[name]):6.2f} s"
        )
    ratio = median(loops["mlflow"]) / median(loops["none"])
    verdict = "meets" if ratio >= 0.95 else "misses"
    print(f"loop steps/s with MLflow / without: {ratio:.3f} ({verdict} the >= 0.95 target)")
    run_ratio = median(runs["none"]) / median(runs["mlflow"])
    print(f"whole-run speed with MLflow / without (incl. per-run fixed costs): {run_ratio:.3f}")


if __name__ == "__main__":
    main()
