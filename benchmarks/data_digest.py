"""What identifying the data by content costs: the source file's digest against a whole ``recipes test``.

Every fit checkpoint carries the SHA-256 digest of its source file (``recipes/checkpoints/data_content.py``), and an
evaluation hashes its source once to compare (``recipes/checkpoints/data_guard.py``; the digest is cached for the
command, so the dataset inputs and the checkpoint's split check do not read the file again). This script writes a
table of ``--rows`` rows (10 numeric columns and a 3-class label; 1,000,000 rows is about 100 MB) and measures,
median of ``--repeats`` runs each, the page cache warm:

* ``digest``: ``recipes.tracking.dataset_inputs.file_digest`` of the file (past its per-command cache);
* ``sha256``: ``hashlib.file_digest(f, "sha256")`` of the same file: what reading and hashing the bytes costs at
  best (the digest's own overhead is the difference);
* ``read_csv``: ``pandas.read_csv`` of the file, what any command on it pays first;
* ``test``: a whole ``recipes test --ckpt_path last`` on the table (a fresh process, as a user runs it; a tiny fit
  made it once beforehand), unless ``--no-command``.

Then the ratios digest / read_csv and digest / test (the digest's share of the command).

    python benchmarks/data_digest.py                       # 1,000,000 rows, 5 repeats
    python benchmarks/data_digest.py --quick               # 20,000 rows, 2 repeats, no command: checks that it runs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, machine, median

from recipes.tracking import dataset_inputs

TABULAR = REPO / "configs" / "tabular_mlp.yaml"
DATA = "digest_table.csv"
COLUMNS = [f"x{i}" for i in range(10)]
QUIET = ["--mlflow_model", "false", "--system_metrics_interval", "0", "--trainer.enable_progress_bar", "false"]


def write_table(path: Path, rows: int) -> None:
    """``rows`` rows of 10 numeric columns (6 decimals) and a label ``a``/``b``/``c`` that depends on them."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    values = rng.normal(size=(rows, len(COLUMNS))).astype("float32")
    frame = pd.DataFrame(values, columns=COLUMNS)
    frame["label"] = np.array(["a", "b", "c"])[(values[:, 0] > 0).astype(int) + (values[:, 1] > 1).astype(int)]
    frame.to_csv(path, index=False, float_format="%.6f")


def timed(action, repeats: int) -> list[float]:
    """Wall seconds of each of ``repeats`` calls of ``action``."""
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return seconds


def fresh_digest(path: Path) -> str:
    """``file_digest`` past its per-command cache: the file's bytes are read and hashed."""
    return dataset_inputs.file_digest(path, cached=False)


def sha256_only(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def recipes_command(directory: Path, *args: str) -> list[str]:
    data = ["--data.init_args.path", DATA, "--data.init_args.target", "label", "--data.init_args.categorical", "[]"]
    return [sys.executable, "-m", "recipes", *args, "-c", str(TABULAR), *data, *QUIET]


def run_command(directory: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(recipes_command(directory, *args), cwd=directory, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"`recipes {' '.join(args)}` failed ({done.returncode}):\n{done.stderr[-3000:]}")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/loopwise_data_digest"), help="where the table goes")
    parser.add_argument("--no-command", dest="command", action="store_false", help="skip the `recipes test` runs")
    parser.add_argument("--quick", action="store_true", help="20,000 rows, 2 repeats, no command")
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats, args.command = 20_000, 2, False
    directory = args.dir / f"rows{args.rows}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / DATA
    if not path.exists():
        write_table(path, args.rows)
    size_mb = path.stat().st_size / 1e6
    print(f"{machine()}\ntable: {args.rows:,} rows, {size_mb:.1f} MB ({path})")

    import pandas as pd

    assert fresh_digest(path) == sha256_only(path)[:32]  # the same digest, and the page cache warm
    figures = {
        "digest_s": median(timed(lambda: fresh_digest(path), args.repeats)),
        "sha256_s": median(timed(lambda: sha256_only(path), args.repeats)),
        "read_csv_s": median(timed(lambda: pd.read_csv(path), args.repeats)),
    }
    if args.command:
        for name in ("checkpoints", "mlruns"):  # a fresh experiment: `last` is the fit below
            shutil.rmtree(directory / name, ignore_errors=True)
        (directory / "mlflow.db").unlink(missing_ok=True)
        run_command(directory, "fit", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                    "--trainer.limit_val_batches", "1")
        if not list((directory / "checkpoints").rglob("last.ckpt")):
            raise SystemExit(f"the fit in {directory} wrote no last.ckpt")
        figures["test_s"] = median(timed(lambda: run_command(directory, "test", "--ckpt_path", "last"), args.repeats))
    print(f"median of {args.repeats}: file_digest {figures['digest_s']:.3f} s ({size_mb / figures['digest_s']:.0f} "
          f"MB/s), hashlib.file_digest {figures['sha256_s']:.3f} s, pandas.read_csv {figures['read_csv_s']:.3f} s"
          + (f", recipes test {figures['test_s']:.2f} s" if "test_s" in figures else ""))
    figures["digest_per_read_csv"] = figures["digest_s"] / figures["read_csv_s"]
    print(f"digest / read_csv: {figures['digest_per_read_csv']:.3f}")
    figures["digest_per_sha256"] = figures["digest_s"] / figures["sha256_s"]
    print(f"digest / hashlib.file_digest: {figures['digest_per_sha256']:.3f}")
    if "test_s" in figures:
        figures["digest_share_of_test"] = figures["digest_s"] / figures["test_s"]
        print(f"digest / recipes test: {figures['digest_share_of_test']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
