"""GPU path: the recipe vs a raw loop, images/s on a synthetic 3x32x32 10-class task with the ConvNet.

    python benchmarks/gpu.py                          # on a CUDA GPU: fp32, bf16 + channels_last, + compile
    python benchmarks/gpu.py --device cpu --steps small   # smoke run on CPU: fp32 only, no targets checked

Settings, each as a raw loop and as ``recipes fit`` in this process, interleaved (raw, recipe, raw, recipe, ...):

  fp32      float32 (``float32_matmul_precision`` "highest": no TF32), AdamW
  bf16      ``-c configs/trainer/gpu-bf16.yaml``: bf16-mixed autocast, channels_last, TF32 matmuls
  compile   bf16 as above plus ``--model.init_args.compile true`` (torch.compile of the network)

Both loops keep the data on the GPU (the recipe with ``device_resident: true``; the raw loop indexes the same
tensors there), use fused AdamW (the task picks it on CUDA), the same schedule and gradient clipping (norm 1.0),
and are timed over the training batches of epochs 2..N (not start-up, compilation's first epoch or validation).
Targets: recipe / raw >= 0.95 for every setting; bf16 >= 1.8x fp32 (recipe). Without CUDA the script says so and
exits 0 unless ``--device cpu`` asks for the smoke run. On CUDA the recipe runs with ``_common.NoHostSyncs``:
``torch.cuda.set_sync_debug_mode("error")`` on every training batch that is not a logging step, an epoch's last
batch or the run's last step, so a host-device sync there stops the benchmark with the operation that made it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import LoopTimer, in_directory, machine, median, quiet, set_threads, synchronize, throughput

RATIO_TARGET = 0.95
BF16_TARGET = 1.8

CONFIG = """\
seed_everything: 0
trainer:
  max_epochs: 3
  gradient_clip_val: 1.0
  log_every_n_steps: 50
  num_sanity_val_steps: 0
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    num_classes: 10
    model:
      class_path: lightning_modules.models.ConvNet
      init_args: {in_channels: 3, num_classes: 10, widths: WIDTHS}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: 0.002, weight_decay: 0.05}
    schedule:
      class_path: lightning_modules.optim.WarmupCosine
      init_args: {warmup_fraction: 0.05}
data:
  class_path: datamodules.SyntheticDataModule
  init_args: {n_samples: N_SAMPLES, n_classes: 10, image_shape: [3, 32, 32], batch_size: BATCH, val_fraction: 0.05,
              seed: 0, device_resident: true}
"""


def sizes(small: bool) -> dict[str, Any]:
    if small:
        return {"n_samples": 640, "batch": 64, "widths": [8, 16], "epochs": 2}
    return {"n_samples": 26_950, "batch": 256, "widths": [64, 128, 256], "epochs": 3}  # 100 train batches


def train_data(size: dict[str, Any], device: Any) -> tuple[Any, Any]:
    from datamodules import SyntheticDataModule

    dm = SyntheticDataModule(n_samples=size["n_samples"], n_classes=10, image_shape=[3, 32, 32],
                             batch_size=size["batch"], val_fraction=0.05, seed=0)
    dm.setup("fit")
    x, y = dm.datasets["train"].tensors
    return x.to(device), y.to(device)


def run_raw(setting: str, size: dict[str, Any], device_name: str) -> list[tuple[int, float, int, int]]:
    """The hand-written loop at its best for ``setting``: data on the device, fused AdamW, the same schedule."""
    import torch
    import torch.nn.functional as F

    from lightning_modules.models import ConvNet
    from lightning_modules.optim import WarmupCosine, fused_if_cuda, param_groups

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    if cuda:
        torch.set_float32_matmul_precision("highest" if setting == "fp32" else "high")
    x, y = train_data(size, device)
    torch.manual_seed(0)
    model = ConvNet(3, 10, size["widths"]).to(device)
    bf16 = setting != "fp32" and cuda
    if bf16:
        model = model.to(memory_format=torch.channels_last)
    optimizer = fused_if_cuda(torch.optim.AdamW(param_groups(model), lr=0.002, weight_decay=0.05))
    steps = (len(x) + size["batch"] - 1) // size["batch"]
    scheduler = WarmupCosine(warmup_fraction=0.05).build(optimizer, steps * size["epochs"], "", "min")["scheduler"]
    net = torch.compile(model) if setting == "compile" else model
    model.train()
    generator = torch.Generator().manual_seed(0)
    out = []
    for epoch in range(size["epochs"]):
        order = torch.randperm(len(x), generator=generator).to(device)
        synchronize(device)
        start = time.perf_counter()
        for i in range(0, len(x), size["batch"]):
            idx = order[i:i + size["batch"]]
            xb, yb = x[idx], y[idx]
            if bf16:
                xb = xb.contiguous(memory_format=torch.channels_last)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
        synchronize(device)
        out.append((epoch, time.perf_counter() - start, len(x), steps))
    return out


def run_recipe(setting: str, size: dict[str, Any], device_name: str, workdir: Path) -> list[tuple[int, float, int, int]]:
    from _common import REPO
    from recipes.cli import main

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "gpu_convnet.yaml"
    config.write_text(CONFIG.replace("WIDTHS", str(size["widths"])).replace("N_SAMPLES", str(size["n_samples"]))
                      .replace("BATCH", str(size["batch"])))
    args = ["fit", "-c", str(config), "--trainer.max_epochs", str(size["epochs"]),
            "--trainer.callbacks+=_common.LoopTimer", "--trainer.callbacks+=_common.NoHostSyncs"]
    if device_name == "cpu":
        args += ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true"]
    elif setting == "fp32":
        args += ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
                 "--float32_matmul_precision", "highest"]
    else:
        args += ["-c", str(REPO / "configs" / "trainer" / "gpu-bf16.yaml")]
    if setting == "compile":
        args += ["--model.init_args.compile", "true"]
    LoopTimer.reset()
    with in_directory(workdir), quiet():
        main(args)
    return list(LoopTimer.epochs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--steps", choices=["full", "small"], default="full", help="small: a tiny smoke run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", nargs="+", choices=["fp32", "bf16", "compile"], default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu: skipped: torch sees no CUDA device (run with --device cpu --steps small for a smoke run)")
        if args.json:
            args.json.write_text(json.dumps({"benchmark": "gpu", "skipped": "no CUDA device"}))
        return 0
    small = args.steps == "small"
    size = sizes(small)
    settings = args.settings or (["fp32"] if args.device == "cpu" else ["fp32", "bf16", "compile"])
    if args.device == "cpu":
        settings = [s for s in settings if s == "fp32"]  # bf16 autocast and compile are GPU measurements here
    repeats = 1 if small else args.repeats
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    print(f"gpu: {machine()}")
    print(f"  device {args.device}, settings {', '.join(settings)}, {repeats} repetition(s) x {size['epochs']} "
          f"epochs of {size['n_samples']:,} samples (batch {size['batch']}, ConvNet widths {size['widths']})")
    rates: dict[str, dict[str, list[float]]] = {s: {"raw": [], "recipe": []} for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        if not small:  # imports, MLflow schema, kernels
            run_recipe(settings[0], sizes(True), args.device, Path(tmp) / "warmup")
        for rep in range(repeats):
            for setting in settings:
                for loop in ("raw", "recipe"):
                    if loop == "raw":
                        epochs = run_raw(setting, size, args.device)
                    else:
                        epochs = run_recipe(setting, size, args.device, Path(tmp) / f"{setting}-{rep}")
                    rate, steps, seconds = throughput(epochs, skip=1)
                    rates[setting][loop].append(rate)
                    print(f"  rep {rep + 1}/{repeats} {setting:>7} {loop:>6}: {rate:9.0f} images/s "
                          f"({steps} steps in {seconds:.2f} s)", flush=True)
    print()
    rows = []
    med = {s: {loop: median(v) for loop, v in by.items()} for s, by in rates.items()}
    for setting in settings:
        ratio = med[setting]["recipe"] / med[setting]["raw"]
        verdict = "meets" if ratio >= RATIO_TARGET else "MISSES"
        if args.device == "cpu":
            verdict = "CPU smoke run: no verdict on"
        print(f"{setting:>7}: raw {med[setting]['raw']:9.0f} images/s, recipe {med[setting]['recipe']:9.0f} images/s, "
              f"recipe / raw = {ratio:.3f} ({verdict} the >= {RATIO_TARGET} target)")
        rows.append({"setting": setting, "ratio": ratio, "met": ratio >= RATIO_TARGET})
    if "bf16" in med and "fp32" in med:
        speedup = med["bf16"]["recipe"] / med["fp32"]["recipe"]
        verdict = "meets" if speedup >= BF16_TARGET else "MISSES"
        print(f"bf16 + channels_last / fp32 (recipe) = {speedup:.2f}x ({verdict} the >= {BF16_TARGET}x target)")
        rows.append({"setting": "bf16/fp32", "ratio": speedup, "met": speedup >= BF16_TARGET})
    elif args.device == "cpu":
        print("bf16 / fp32 target not checked on CPU (smoke run)")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "gpu", "device": args.device, "images_per_s": med,
                                         "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
