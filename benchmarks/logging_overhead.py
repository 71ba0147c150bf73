"""What MLflow tracking costs a recipe: the spiral recipe with the default MLflow logger vs with no logger.

    python benchmarks/logging_overhead.py [--repeats 3] [--epochs 40]

Both variants run in this process through ``recipes.cli.main`` (same data, model, optimizer, schedule, clipping,
checkpoints, plan and doctor), interleaved (mlflow, none, mlflow, none, ...), each in a fresh temporary
directory; the script prints the median wall time of ``fit`` and optimizer steps per second for each, and the
ratio. Target: MLflow costs at most 5% (ratio >= 0.95).
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

REPO = Path(__file__).resolve().parents[1]


def fit_seconds(logger: bool, epochs: int, workdir: Path) -> float:
    """Wall time of one in-process ``recipes fit`` of the spiral recipe, run in ``workdir`` (created)."""
    from recipes.cli import main

    args = ["fit", "-c", str(REPO / "configs" / "spiral_mlp.yaml"), "--trainer.max_epochs", str(epochs)]
    if not logger:
        args += ["--trainer.logger", "false"]
    old = Path.cwd()
    workdir.mkdir(parents=True)
    os.chdir(workdir)
    try:
        start = time.perf_counter()
        with redirect_stdout(StringIO()):
            main(args)
        return time.perf_counter() - start
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
        times: dict[str, list[float]] = {"mlflow": [], "none": []}
        for i in range(args.repeats):
            times["mlflow"].append(fit_seconds(True, args.epochs, root / f"mlflow-{i}"))
            times["none"].append(fit_seconds(False, args.epochs, root / f"none-{i}"))
    steps = args.epochs * 22  # 1,400 train samples / batch 64 = 22 optimizer steps per epoch
    medians = {k: statistics.median(v) for k, v in times.items()}
    for name, seconds in medians.items():
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        print(f"{name:>7}: median {seconds:6.2f} s  ({steps / seconds:7.1f} steps/s)  runs: {runs}")
    ratio = medians["none"] / medians["mlflow"]
    verdict = "meets" if ratio >= 0.95 else "misses"
    print(f"throughput with MLflow / without: {ratio:.3f} ({verdict} the >= 0.95 target)")


if __name__ == "__main__":
    main()
