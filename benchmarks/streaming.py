"""A table larger than memory (issue 56): peak memory and throughput of one training epoch from
``StreamingTableDataModule`` against the in-memory ``TabularDataModule``, and the shuffle's quality.

For each size (``--rows``, default 1M, 3M and 10M rows; ``--huge`` adds 100M) the script writes a Parquet file of 16
float32 columns and a 3-class label (row groups of 65,536 rows, written in chunks: the writer never holds the
table), then runs, each in a fresh process (so each peak is its own), interleaved ``--repeats`` times:

* ``stream``: ``StreamingTableDataModule`` (default window, no loader worker: the recipe's setting) and one epoch of the recipe's network
  (``configs/tabular_stream.yaml``: MLP 256-256, AdamW, batch 512) in a plain training loop;
* ``memory``: ``TabularDataModule`` on the same file (read whole with pandas, encoded once), the same loop; only at
  the sizes where it fits (``--memory-max-rows``, default 3M).

Each process reports the epoch's samples/s (from the start of the pass to its last step; ``setup`` timed apart) and its
peak RSS: the larger of its own and its loader workers' (``getrusage``: the largest process, workers included).
Printed: the medians, the streaming/in-memory throughput ratio at each size and the streaming peak at 10M over the
one at 1M (the targets: >= 0.9 and <= 1.15). Then the shuffle on a 1M-row file sorted by label (10 classes, 1,000
row groups): the largest deviation of a class's share in 1,000 consecutive samples and the mean |Spearman|
between a row's place in the epoch and in the file over 10 seeds.

    python benchmarks/streaming.py                 # 1M, 3M, 10M rows, 5 repeats
    python benchmarks/streaming.py --quick         # 200,000 rows, 1 repeat: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, machine, median

COLUMNS = [f"x{i}" for i in range(16)]
GROUP_ROWS = 65_536
BATCH = 512
#: loader workers of the streaming module: the recipe's (configs/tabular_stream.yaml)
WORKERS = 0


def write_table(path: Path, rows: int, chunk: int = 1_000_000) -> None:
    """``rows`` rows of 16 float32 columns and a label 0-2 that depends on the first three, written a chunk at a
    time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    writer = None
    try:
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            values = rng.normal(size=(n, len(COLUMNS))).astype("float32")
            label = np.digitize(values[:, 0] + values[:, 1] - values[:, 2], [-0.8, 0.8]).astype("int64")
            table = pa.table({**{c: values[:, i] for i, c in enumerate(COLUMNS)}, "y": label})
            if writer is None:
                writer = pq.ParquetWriter(path, table.schema)
            writer.write_table(table, row_group_size=GROUP_ROWS)
    finally:
        if writer is not None:
            writer.close()


def one_epoch(kind: str, path: str, train: str = "model") -> dict[str, float]:
    """In this process: set up ``kind``'s data module, run one epoch of the recipe's network on it (``train=
    "model"``) or only read the epoch's batches (``"loader"``: the memory of the data path alone)."""
    import torch

    from lightning_modules.models import MLP

    torch.set_num_threads(2)
    torch.manual_seed(0)
    started = time.perf_counter()
    if kind == "stream":
        from datamodules import StreamingTableDataModule

        data = StreamingTableDataModule(path, "y", batch_size=BATCH, num_workers=WORKERS, val_fraction=0.1,
                                        test_fraction=0.1)
    else:
        from datamodules import TabularDataModule

        data = TabularDataModule(path, "y", batch_size=BATCH, val_fraction=0.1, test_fraction=0.1)
    data.setup("fit")
    setup_s = time.perf_counter() - started
    model = MLP(data.in_features, 3, hidden_sizes=[256, 256])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = data.train_dataloader()
    samples, first = 0, time.perf_counter()  # from the pass's start: a streamed epoch reads its first window then
    for features, targets in loader:
        if train == "loader":
            samples += len(targets)
            continue
        loss = torch.nn.functional.cross_entropy(model(features), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        samples += len(targets)
    epoch_s = time.perf_counter() - first
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"setup_s": setup_s, "epoch_s": epoch_s, "samples": samples, "samples_per_s": samples / epoch_s,
            "peak_rss_mb": max(own, workers)}


def measure(kind: str, path: Path, train: str = "model") -> dict[str, float]:
    """``one_epoch`` in a fresh process."""
    done = subprocess.run([sys.executable, __file__, "--one", kind, str(path), train], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode:
        raise SystemExit(f"{kind} on {path.name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def shuffle_quality(rows: int = 1_000_000, group_rows: int = 1_000, classes: int = 10) -> dict[str, float]:
    """The default window on a file sorted by label: the module's order, rows stood in by their numbers."""
    import numpy as np
    import torch
    from scipy.stats import spearmanr

    from datamodules.stream_order import DEFAULT_WINDOW
    from datamodules.streaming_table import StreamingTableDataset

    class RowNumbers:
        def encode(self, pieces):  # noqa: ANN001, ANN201
            numbers = np.concatenate([np.arange(p.start, p.stop) + p.group * group_rows for p in pieces])
            return torch.from_numpy(numbers), torch.from_numpy(numbers)

    labels = np.sort(np.random.default_rng(0).integers(0, classes, rows))
    shares = np.bincount(labels, minlength=classes) / rows
    counts = np.full(rows // group_rows, group_rows)
    worst, correlations = 0.0, []
    for seed in range(10):
        dataset = StreamingTableDataset(RowNumbers(), counts, 1000, seed, DEFAULT_WINDOW, shuffle=True)  # type: ignore[arg-type]
        order = torch.cat([b[0] for b in dataset]).numpy()
        windows = labels[order].reshape(-1, 1000)
        mix = np.stack([(windows == c).mean(axis=1) for c in range(classes)], axis=1)
        worst = max(worst, float(np.abs(mix - shares).max()))
        correlations.append(abs(float(spearmanr(np.arange(len(order)), order).statistic)))
    return {"worst_share_deviation": worst, "mean_abs_spearman": float(np.mean(correlations))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=lambda s: [int(float(x)) for x in s.split(",")],
                        default=[1_000_000, 3_000_000, 10_000_000], help="comma-separated sizes (default 1e6,3e6,1e7)")
    parser.add_argument("--huge", action="store_true", help="add 100,000,000 rows (about 7 GB of Parquet)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--memory-max-rows", type=int, default=3_000_000, help="largest size the in-memory module runs")
    parser.add_argument("--dir", type=Path, default=REPO / "benchmarks" / "results" / "streaming_data")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, 1 repeat")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_epoch(*args.one)))
        return
    throughput_sizes = [200_000] if args.quick else [r for r in args.rows if r <= args.memory_max_rows]
    memory_sizes = [200_000, 400_000] if args.quick else [min(args.rows), max(args.rows)] + (
        [100_000_000] if args.huge else [])
    repeats = 1 if args.quick else args.repeats
    args.dir.mkdir(parents=True, exist_ok=True)
    print(machine(threads=False))
    for rows in sorted(set(throughput_sizes) | set(memory_sizes)):
        path = args.dir / f"table_{rows}.parquet"
        if not path.exists():
            write_table(path, rows)
    table = lambda rows: args.dir / f"table_{rows}.parquet"  # noqa: E731
    speed: dict[int, dict[str, list[dict[str, float]]]] = {r: {"stream": [], "memory": []} for r in throughput_sizes}
    memory: dict[int, list[dict[str, float]]] = {r: [] for r in memory_sizes}
    for repeat in range(repeats):  # interleaved, each pair in alternating order: drift hits both sides alike
        for rows in throughput_sizes:
            for kind in ("stream", "memory") if repeat % 2 == 0 else ("memory", "stream"):
                speed[rows][kind].append(measure(kind, table(rows)))
        for rows in memory_sizes:
            memory[rows].append(measure("stream", table(rows), "loader"))
    summary: dict[str, object] = {"machine": machine(threads=False), "sizes": {}, "peak_rss_mb": {}}
    print(f"\nOne epoch of the recipe's network (MLP 256-256, AdamW, batch {BATCH}); medians of {repeats}, spread = "
          "(max - min) / median")
    print("| rows | module | samples/s | spread | peak RSS MB | setup s |")
    print("|---|---|---|---|---|---|")
    for rows, kinds in speed.items():
        figures: dict[str, object] = {}
        for kind, runs in kinds.items():
            rates = [r["samples_per_s"] for r in runs]
            figures[kind] = f = {"samples_per_s": median(rates), "spread": (max(rates) - min(rates)) / median(rates),
                                 "peak_rss_mb": median([r["peak_rss_mb"] for r in runs]),
                                 "setup_s": median([r["setup_s"] for r in runs])}
            print(f"| {rows:,} | {kind} | {f['samples_per_s']:,.0f} | {f['spread']:.1%} | {f['peak_rss_mb']:,.0f} | "
                  f"{f['setup_s']:.1f} |")
        # the ratio of each back-to-back pair, then their median: the machine's load changes between repeats more
        # than between the two runs of one pair (a ratio of the two medians mixes repeats)
        pairs = [s["samples_per_s"] / m["samples_per_s"] for s, m in zip(kinds["stream"], kinds["memory"])]
        figures["throughput_ratio"] = median(pairs)
        figures["pair_ratios"] = pairs
        figures["ratio_of_medians"] = figures["stream"]["samples_per_s"] / figures["memory"]["samples_per_s"]  # type: ignore[index]
        summary["sizes"][str(rows)] = figures  # type: ignore[index]
    print("\nOne epoch of the streaming loader alone (read, encode, shuffle, batch): peak RSS, workers included")
    print("| rows | peak RSS MB (median) | samples/s |")
    print("|---|---|---|")
    for rows, runs in memory.items():
        peak = median([r["peak_rss_mb"] for r in runs])
        summary["peak_rss_mb"][str(rows)] = peak  # type: ignore[index]
        print(f"| {rows:,} | {peak:,.0f} | {median([r['samples_per_s'] for r in runs]):,.0f} |")
    print()
    for rows, figures in summary["sizes"].items():  # type: ignore[union-attr]
        pairs = figures["pair_ratios"]
        print(f"stream / in-memory samples/s at {int(rows):,} rows: {figures['throughput_ratio']:.2f} (target >= 0.9; "
              f"median of {len(pairs)} back-to-back pairs, from {min(pairs):.2f} to {max(pairs):.2f}; ratio of the "
              f"medians {figures['ratio_of_medians']:.2f})")
    peaks = summary["peak_rss_mb"]  # type: ignore[assignment]
    low, high = str(min(memory_sizes)), str(max(memory_sizes))
    summary["peak_ratio"] = ratio = peaks[high] / peaks[low]
    summary["peak_sizes"] = [int(low), int(high)]
    print(f"stream peak RSS, {int(high):,} rows / {int(low):,} rows: {ratio:.3f} (target <= 1.15)")
    quality = shuffle_quality() if not args.quick else shuffle_quality(rows=100_000, group_rows=100)
    summary["shuffle"] = quality
    print(f"shuffle of a file sorted by label: largest class-share deviation in 1,000 consecutive samples "
          f"{quality['worst_share_deviation']:.3f} (target < 0.05), mean |Spearman| {quality['mean_abs_spearman']:.4f} "
          "(target < 0.05)")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
