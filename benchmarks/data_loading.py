"""Data loading: in-memory batches fetched whole (the data modules' path) vs per-sample __getitem__ + collate.

    python benchmarks/data_loading.py             # 5 interleaved repetitions
    python benchmarks/data_loading.py --quick     # 1 repetition, fewer samples

One epoch over N in-memory samples, shuffled, no model, main process (num_workers=0, the right choice for
in-memory data), three ways, interleaved (slice, batched, per-sample, slice, ...):

  slice      index the tensors with a slice of a permutation (the limit)
  batched    DataLoader(BatchedTensorDataset, collate_fn=keep_batch): one index per tensor per batch, as
             ``BaseDataModule`` builds it (DataLoader semantics: samplers, DistributedSampler, workers)
  per-sample DataLoader(TensorDataset): batch_size ``__getitem__`` calls and a default collate per batch

for 2 features at batch 64 (the spiral) and 784 features at batch 256. Prints batches per second and ratios.
docs/ARCHITECTURE.md (datamodules, tensor_dataset.py): in-memory data does not pay the per-sample cost; issue 8
sets no number, so the ratios are printed without a verdict (batched / per-sample well above 1, batched / slice what
the DataLoader machinery costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

def epoch_seconds(kind: str, x, y, batch_size: int, seed: int) -> tuple[float, int]:
    import torch
    from torch.utils.data import DataLoader, RandomSampler, TensorDataset

    from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch

    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    batches = 0
    if kind == "slice":
        order = torch.randperm(len(x), generator=generator)
        for i in range(0, len(x), batch_size):
            idx = order[i:i + batch_size]
            xb, yb = x[idx], y[idx]
            batches += 1
    else:
        if kind == "batched":
            loader = DataLoader(BatchedTensorDataset(x, y), batch_size=batch_size, collate_fn=keep_batch,
                                sampler=RandomSampler(range(len(x)), generator=generator))
        else:
            loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True, generator=generator)
        for xb, yb in loader:
            batches += 1
    return time.perf_counter() - start, batches


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--quick", action="store_true", help="1 repetition, 4,000 samples")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the ratios to this JSON file")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    repeats = 1 if args.quick else args.repeats
    n = 4_000 if args.quick else args.samples
    shapes = {"spiral (2 features, batch 64)": (2, 64), "784 features, batch 256": (784, 256)}
    kinds = ("slice", "batched", "per-sample")
    print(f"data loading: {n:,} samples, {repeats} repetition(s), main process, torch {torch.__version__}")
    rates: dict[str, dict[str, list[float]]] = {s: {k: [] for k in kinds} for s in shapes}
    generator = torch.Generator().manual_seed(0)
    data = {s: (torch.randn(n, f, generator=generator), torch.randint(0, 10, (n,), generator=generator))
            for s, (f, _) in shapes.items()}
    for rep in range(repeats + 1):  # the first round warms up and is not counted
        for shape, (_, batch_size) in shapes.items():
            for kind in kinds:
                seconds, batches = epoch_seconds(kind, *data[shape], batch_size, seed=rep)
                if rep:
                    rates[shape][kind].append(batches / seconds)
    rows = []
    for shape, by_kind in rates.items():
        med = {k: statistics.median(v) for k, v in by_kind.items()}
        print(f"{shape}: " + ", ".join(f"{k} {med[k]:,.0f} batches/s" for k in kinds))
        ratio = med["batched"] / med["per-sample"]
        print(f"  batched / per-sample = {ratio:.1f}x; batched / slice = {med['batched'] / med['slice']:.2f}")
        rows.append({"shape": shape, "batched_over_per_sample": ratio, "batched_over_slice":
                     med["batched"] / med["slice"]})
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "data_loading", "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
