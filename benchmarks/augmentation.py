"""Augmentation throughput: images/s of an image folder's train loader as the training step receives them, augmented.

    python benchmarks/augmentation.py                  # 5 interleaved repetitions, CPU, num_workers 0 and 2
    python benchmarks/augmentation.py --quick          # under a minute: fewer images, 1 repetition, num_workers 0
    python benchmarks/augmentation.py --device cuda    # the batched augmentation runs on the GPU (the device run)

ImageFolderDataModule over PNGs written to a temporary folder (3 classes; ``cache: true``, so files are decoded
once and every variant pays the same per-sample normalization), one train epoch per measurement, in four ways,
interleaved (none, per-sample, batched crop+flip, batched crop+flip+jitter, none, ...):

  none                     no augmentation (the loader alone)
  per-sample               today's ``augment: true``: zero-padded random crop and flip per image in the loader
  batched crop+flip        ``batch_augmentation``: random resized crop + flip on the whole batch (parameters drawn
                           on the CPU, one warp on a GPU), after the transfer to ``--device`` (what
                           ``on_after_batch_transfer`` runs)
  batched crop+flip+jitter the same plus colour jitter (brightness, contrast, saturation, hue)

at 3x64x64 (batch 64) and 3x224x224 (batch 32), num_workers 0 and 2. The first epoch of every variant warms up and is
not counted. Prints the median images/s (and the range), and each variant's ratio to per-sample; issue 33 sets no
number, so no verdict.

``--baseline FILE`` (e.g. ``git show <commit>:datamodules/batch_augmentation.py > /tmp/old.py``) also times the
augmentation call alone, on ready batches on ``--device``: that file's ``BatchAugmentation`` vs today's, interleaved,
milliseconds per batch (median and range).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VARIANTS = ("none", "per-sample", "batched crop+flip", "batched crop+flip+jitter")
JITTER = {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}


def write_images(root: Path, count: int, side: int) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class_{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(folder / f"{i:04d}.png")


def make_loader(root: Path, side: int, batch_size: int, workers: int, variant: str):
    """The variant's data module (set up) and its BatchAugmentation (or None)."""
    from datamodules import BatchAugmentation, ImageFolderDataModule

    augmentation = None
    if variant.startswith("batched"):
        augmentation = BatchAugmentation(**(JITTER if "jitter" in variant else {}))
    data = ImageFolderDataModule(str(root), image_size=side, batch_size=batch_size, val_fraction=0.1,
                                 num_workers=workers, cache=True, augment=variant == "per-sample",
                                 batch_augmentation=augmentation)
    data.setup("fit")
    return data, augmentation


def epoch_rate(data, augmentation, device) -> float:
    """Images per second of one train epoch, moved to ``device`` and augmented as the step receives them."""
    import torch

    images_seen = 0
    start = time.perf_counter()
    for images, labels in data.train_dataloader():
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        if augmentation is not None:
            images, labels = augmentation(images, labels, data.mean, data.std, data.num_classes)
        images_seen += len(images)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return images_seen / (time.perf_counter() - start)


def load_baseline(path: Path):
    """The ``BatchAugmentation`` class of another version of ``datamodules/batch_augmentation.py``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("baseline_batch_augmentation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BatchAugmentation


def compare_calls(baseline, device, sides: list[int], repeats: int) -> None:
    """Milliseconds per augmentation call on ready batches: ``baseline`` vs today's class, interleaved."""
    import torch

    from datamodules import BatchAugmentation

    mean, std = torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0.25, 0.25, 0.25])
    for side, batch_size, calls in [(64, 64, 10), (224, 32, 4)]:
        if side not in sides:
            continue
        images = torch.randn(batch_size, 3, side, side, device=device)
        labels = (torch.arange(batch_size) % 3).to(device)
        for name, config in (("crop+flip", {}), ("crop+flip+jitter", JITTER)):
            versions = {"baseline": baseline(**config), "current": BatchAugmentation(**config)}
            times: dict[str, list[float]] = {v: [] for v in versions}
            for rep in range(repeats + 1):
                for version, augmentation in versions.items():
                    start = time.perf_counter()
                    for _ in range(calls):
                        augmentation(images, labels, mean, std, 3)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    if rep:
                        times[version].append((time.perf_counter() - start) / calls * 1000)
            med = {v: statistics.median(t) for v, t in times.items()}
            print(f"call alone, 3x{side}x{side}, batch {batch_size}, {name}: " + ", ".join(
                f"{v} {med[v]:.2f} ms ({min(times[v]):.2f}-{max(times[v]):.2f})" for v in versions)
                + f"; baseline / current = {med['baseline'] / med['current']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 repetition, fewer images, num_workers 0 only")
    parser.add_argument("--device", default="cpu", help="where the batched augmentation runs (cpu, cuda)")
    parser.add_argument("--workers", type=int, nargs="+", default=None, help="num_workers values (default 0 2)")
    parser.add_argument("--sides", type=int, nargs="+", default=[64, 224], choices=[64, 224],
                        help="image sides to measure (default 64 224)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the ratios to this JSON file")
    parser.add_argument("--baseline", type=Path, help="also time the call alone: this file's BatchAugmentation vs "
                                                      "today's (another version of batch_augmentation.py)")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("augmentation: --device cuda but no CUDA device", file=sys.stderr)
        return 1
    repeats = 1 if args.quick else args.repeats
    workers = args.workers or ([0] if args.quick else [0, 2])
    # (side, batch size, images): enough batches per epoch for a stable rate, few enough for 2 CPU cores
    shapes = [(64, 64, 128 if args.quick else 1024), (224, 32, 64 if args.quick else 256)]
    shapes = [shape for shape in shapes if shape[0] in args.sides]
    print(f"augmentation: {repeats} repetition(s), device {device}, num_workers {workers}, torch {torch.__version__}")
    if args.baseline:
        compare_calls(load_baseline(args.baseline), device, args.sides, args.repeats)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for side, batch_size, count in shapes:
            root = Path(tmp) / f"images_{side}"
            write_images(root, count, side)
            for n_workers in workers:
                loaders = {v: make_loader(root, side, batch_size, n_workers, v) for v in VARIANTS}
                rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
                for rep in range(repeats + 1):  # the first round warms up (workers, the first call)
                    for variant in VARIANTS:
                        rate = epoch_rate(*loaders[variant], device)
                        if rep:
                            rates[variant].append(rate)
                med = {v: statistics.median(r) for v, r in rates.items()}
                shape = f"3x{side}x{side}, batch {batch_size}, num_workers {n_workers}"
                print(f"{shape}: " + ", ".join(
                    f"{v} {med[v]:,.0f} img/s ({min(rates[v]):,.0f}-{max(rates[v]):,.0f})" for v in VARIANTS))
                for variant in VARIANTS[2:]:
                    ratio = med[variant] / med["per-sample"]
                    print(f"  {variant} / per-sample = {ratio:.2f}")
                    rows.append({"shape": shape, "variant": variant, "ratio": ratio,
                                 "images_per_s": {v: med[v] for v in VARIANTS}})
                del loaders
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "augmentation", "device": str(device), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
