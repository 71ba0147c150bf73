"""Memory: peak RSS of the spiral recipe beside the seeds' loop, and RSS growth across epochs.

    python benchmarks/memory.py              # 20 epochs each, one fresh process per variant
    python benchmarks/memory.py --quick      # 4 epochs (growth compared between epochs 2 and 4)

Each variant runs in its own process, since the peak resident set size (``getrusage``) is per process:

  floor    ``import torch, lightning`` and nothing else
  seeds    the seeds' loop on the spiral (overhead.py's ``seeds`` variant)
  recipe   ``recipes fit -c configs/spiral_mlp.yaml`` in-process, MLflow logging on

The RSS after each epoch's training batches comes from /proc/self/statm. Targets: no growth across epochs (the
recipe's RSS after epoch 20 within 5% of its RSS after epoch 2); the peaks are printed beside each other (recipe
minus seeds: what Lightning, MLflow and the recipe's callbacks hold).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MB = 1024 * 1024
GROWTH_TARGET = 0.05


def child(variant: str, epochs: int, out: Path) -> None:
    """Run one variant in this process and write its peak RSS and per-epoch RSS to ``out``."""
    sys.path.insert(0, str(HERE))
    from _common import LoopTimer, peak_rss_bytes, rss_bytes

    per_epoch: list[tuple[int, int]] = []
    if variant == "seeds":
        import overhead

        overhead.run_seeds(overhead.workloads(False)["spiral"], epochs,
                           after_epoch=lambda e: per_epoch.append((e, rss_bytes())))
    elif variant == "recipe":
        import overhead

        with tempfile.TemporaryDirectory() as tmp:
            overhead.run_recipe(overhead.workloads(False)["spiral"], epochs, Path(tmp) / "run")
        per_epoch = list(LoopTimer.rss)
    out.write_text(json.dumps({"peak": peak_rss_bytes(), "per_epoch": per_epoch}))


def measure(variant: str, epochs: int, tmp: Path) -> dict:
    out = tmp / f"{variant}.json"
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    proc = subprocess.run([sys.executable, __file__, "--child", variant, "--epochs", str(epochs), "--out", str(out)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"memory child {variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 20; --quick 4)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument("--child", choices=["floor", "seeds", "recipe"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    epochs = args.epochs or (4 if args.quick else 20)
    if args.child:
        if args.child == "floor":
            import lightning  # noqa: F401
            import torch  # noqa: F401
        child(args.child, epochs, args.out)
        return
    print(f"memory: spiral, {epochs} epochs, one process per variant")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("floor", "seeds", "recipe"):
            results[variant] = measure(variant, epochs, Path(tmp))
            print(f"  {variant:>6}: peak RSS {results[variant]['peak'] / MB:7.1f} MB", flush=True)
    peaks = {v: r["peak"] / MB for v, r in results.items()}
    print()
    print(f"peak RSS: floor {peaks['floor']:.1f} MB, seeds' loop {peaks['seeds']:.1f} MB, recipe {peaks['recipe']:.1f} MB"
          f" (recipe / seeds {peaks['recipe'] / peaks['seeds']:.2f}x, +{peaks['recipe'] - peaks['seeds']:.1f} MB)")
    rows = []
    for variant in ("seeds", "recipe"):
        per_epoch = dict(results[variant]["per_epoch"])
        if 1 in per_epoch and (epochs - 1) in per_epoch:
            early, late = per_epoch[1], per_epoch[epochs - 1]
            growth = late / early - 1
            verdict = "meets" if growth <= GROWTH_TARGET else "MISSES"
            print(f"{variant}: RSS after epoch 2 {early / MB:.1f} MB, after epoch {epochs} {late / MB:.1f} MB: "
                  f"growth {growth:+.2%} ({verdict} the <= {GROWTH_TARGET:.0%} target)")
            rows.append({"variant": variant, "growth": growth, "met": growth <= GROWTH_TARGET})
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "memory", "epochs": epochs, "peak_mb": peaks,
                                         "growth": rows}, indent=2))


if __name__ == "__main__":
    main()
