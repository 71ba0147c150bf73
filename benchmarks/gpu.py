"""GPU path: the recipe vs a raw loop, images/s on a synthetic 10-class task: the ConvNet at 3x32x32, or (issue 58)
transformers' ResNet-18 or ViT-S/16 at 224 px.

    python benchmarks/gpu.py                          # on a CUDA GPU: fp32, bf16 + channels_last, + compile
    python benchmarks/gpu.py --network resnet18 --settings fp32 bf16 --loops raw recipe   # (or --network vit_s)
    python benchmarks/gpu.py --device cpu --steps small   # smoke run on CPU: fp32 only, no targets checked
    python benchmarks/gpu.py --loops lightning recipe --settings bf16     # only some loops / settings
    python benchmarks/gpu.py --profile bf16 --profile-out gpu_profile.txt  # host time per step, by hook

Loops, interleaved (raw, lightning, recipe, raw, ...; ``--loops`` picks some):

  raw        a hand-written PyTorch loop
  lightning  bare Lightning: a minimal LightningModule with the same network, loss, fused AdamW, schedule and
             clipping; ``Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
             enable_model_summary=False)``; the raw loop's device-resident batches in the raw loop's order (an
             iterable, no DataLoader). lightning / raw is Lightning's own per-step cost, recipe / lightning
             loopwise's (its data loader, metrics, logging, callbacks)
  recipe     ``recipes fit`` in this process

Settings, each run by every loop:

  fp32      float32 (``float32_matmul_precision`` "highest": no TF32), AdamW
  bf16      ``-c configs/trainer/gpu-bf16.yaml``: bf16-mixed autocast, channels_last, TF32 matmuls
  compile   bf16 as above plus ``--model.init_args.compile true`` (torch.compile of the network)

Networks (``--network``): ``convnet`` (widths 64-128-256, batch 256); ``resnet18`` (``ResNetConfig``, basic blocks,
depths 2-2-2-2, widths 64-512) and ``vit_s`` (``ViTConfig``, patch 16, width 384, 12 layers, 6 heads), 224 px, batch
128, built with random weights (seed 0) and saved with ``save_pretrained`` into a temporary folder that every loop
loads as ``lightning_modules.models.HFImageClassifier`` (the device has no network: nothing is downloaded).

Both loops keep the data on the GPU (the recipe with ``device_resident: true``; the raw loop indexes the same
tensors there), use fused AdamW (the task picks it on CUDA), the same schedule and gradient clipping (norm 1.0),
and are timed over the training batches of epochs 2..N (not start-up, compilation's first epoch or validation).
Targets: recipe / raw >= 0.95 for every setting; bf16 >= 1.8x fp32 (recipe). Without CUDA the script says so and
exits 0 unless ``--device cpu`` asks for the smoke run. On CUDA the recipe runs with ``_common.NoHostSyncs``:
``torch.cuda.set_sync_debug_mode("error")`` on every training batch that is not a logging step, an epoch's last
batch or the run's last step, so a host-device sync there stops the benchmark with the operation that made it.

``--profile SETTING`` times nothing: it fits the lightning and the recipe loop once each under SETTING and, over 30
training steps of the second epoch, records with ``torch.profiler`` (CPU activities, ``record_shapes`` off) every
Lightning hook as a ``record_function`` range (``HookProfiler``, a Lightning profiler); it prints the host time per
step of each hook (inclusive: a hook's time holds the hooks it calls) and the top 15 entries by self CPU time
(a hook range's self time is its Python, outside the torch operations and the hooks below it), and writes both to
``--profile-out``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
from _common import (
    LoopTimer,
    cuda_missing,
    in_directory,
    machine,
    median,
    quiet,
    set_threads,
    synchronize,
    throughput,
)
from lightning.pytorch.profilers import Profiler

LOOPS = ["raw", "lightning", "recipe"]
PROFILE_WINDOW = (1, 20, 30)  # epoch (0-based), first batch, steps

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
    model: NETWORK
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: LR, weight_decay: 0.05}
    schedule:
      class_path: lightning_modules.optim.WarmupCosine
      init_args: {warmup_fraction: 0.05}
data:
  class_path: datamodules.SyntheticDataModule
  init_args: {n_samples: N_SAMPLES, n_classes: 10, image_shape: [3, SIDE, SIDE], batch_size: BATCH,
              val_fraction: 0.05, seed: 0, device_resident: true}
"""


NETWORKS = ["convnet", "resnet18", "vit_s"]
# the two Hugging Face networks, as transformers configs (random weights, built here: the device has no network)
HF_CONFIGS = {
    "resnet18": {"full": {"layer_type": "basic", "embedding_size": 64, "hidden_sizes": [64, 128, 256, 512],
                          "depths": [2, 2, 2, 2]},
                 "small": {"layer_type": "basic", "embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]}},
    "vit_s": {"full": {"patch_size": 16, "hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6,
                       "intermediate_size": 1536},
              "small": {"patch_size": 8, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                        "intermediate_size": 64}},
}


def sizes(small: bool, network: str = "convnet") -> dict[str, Any]:
    """Samples, batch, image side, epochs and learning rate of a full run or a smoke run of ``network``."""
    if network == "convnet":
        if small:
            return {"network": network, "n_samples": 640, "batch": 64, "widths": [8, 16], "epochs": 2, "side": 32,
                    "lr": 0.002}
        return {"network": network, "n_samples": 26_950, "batch": 256, "widths": [64, 128, 256], "epochs": 3,
                "side": 32, "lr": 0.002}  # 100 train batches
    if small:
        return {"network": network, "n_samples": 160, "batch": 16, "epochs": 2, "side": 32, "lr": 0.0003,
                "hf": HF_CONFIGS[network]["small"]}
    # 224 px, batch 128: 2,432 training images, 19 batches an epoch, epochs 2-3 timed (38 steps)
    return {"network": network, "n_samples": 2_560, "batch": 128, "epochs": 3, "side": 224, "lr": 0.0003,
            "hf": HF_CONFIGS[network]["full"]}


def describe_network(size: dict[str, Any]) -> str:
    if size["network"] == "convnet":
        return f"ConvNet widths {size['widths']}, 3x32x32"
    shown = ", ".join(f"{k} {v}" for k, v in size["hf"].items())
    return f"{size['network']} (transformers, random weights: {shown}), 3x{size['side']}x{size['side']}"


def save_hf_network(size: dict[str, Any], folder: Path) -> None:
    """The Hugging Face network of ``size`` with random weights (seed 0), written with ``save_pretrained`` into
    ``folder`` (``size["model_dir"]``), where ``HFImageClassifier`` loads it from as from the hub."""
    import torch
    import transformers

    labels = {i: f"pretrained{i}" for i in range(10)}  # a "pretrained" head: HFImageClassifier replaces it
    common = {"num_channels": 3, "id2label": labels, "label2id": {v: k for k, v in labels.items()}}
    torch.manual_seed(0)
    if size["network"] == "resnet18":
        model = transformers.ResNetForImageClassification(transformers.ResNetConfig(**size["hf"], **common))
    else:
        model = transformers.ViTForImageClassification(transformers.ViTConfig(image_size=size["side"], **size["hf"],
                                                                              **common))
    model.save_pretrained(folder)
    size["model_dir"] = str(folder)


def build_network(size: dict[str, Any]) -> Any:
    """The network every loop trains: ``ConvNet``, or ``HFImageClassifier`` of the saved Hugging Face network."""
    from lightning_modules.models import ConvNet, HFImageClassifier

    if size["network"] == "convnet":
        return ConvNet(3, 10, size["widths"])
    return HFImageClassifier(size["model_dir"], num_classes=10)


def network_config(size: dict[str, Any]) -> str:
    """The recipe's ``model.init_args.model`` of ``size``'s network, as YAML flow text."""
    if size["network"] == "convnet":
        return ("{class_path: lightning_modules.models.ConvNet, init_args: {in_channels: 3, num_classes: 10, "
                f"widths: {size['widths']}}}}}")
    return ("{class_path: lightning_modules.models.HFImageClassifier, init_args: {name_or_path: "
            f"{json.dumps(size['model_dir'])}, num_classes: 10}}}}")


def train_data(size: dict[str, Any], device: Any) -> tuple[Any, Any]:
    """The training split of the recipe's data module, on ``device`` (made once per size: 224 px images take
    seconds to generate)."""
    x, y = generated(size["n_samples"], size.get("side", 32), size["batch"])
    return x.to(device), y.to(device)


@functools.lru_cache(maxsize=1)
def generated(n_samples: int, side: int, batch: int) -> tuple[Any, Any]:
    from datamodules import SyntheticDataModule

    dm = SyntheticDataModule(n_samples=n_samples, n_classes=10, image_shape=[3, side, side], batch_size=batch,
                             val_fraction=0.05, seed=0)
    dm.setup("fit")
    return dm.datasets["train"].tensors


def run_raw(setting: str, size: dict[str, Any], device_name: str) -> list[tuple[int, float, int, int]]:
    """The hand-written loop at its best for ``setting``: data on the device, fused AdamW, the same schedule."""
    import torch
    import torch.nn.functional as F

    from lightning_modules.optim.optimizer_kernels import fused_where_supported
    from lightning_modules.optim.parameter_groups import param_groups
    from lightning_modules.optim.schedules import WarmupCosine

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    if cuda:
        torch.set_float32_matmul_precision("highest" if setting == "fp32" else "high")
    x, y = train_data(size, device)
    torch.manual_seed(0)
    model = build_network(size).to(device)
    bf16 = setting != "fp32" and cuda
    if bf16:
        model = model.to(memory_format=torch.channels_last)
    optimizer = fused_where_supported(torch.optim.AdamW(param_groups(model), lr=size["lr"], weight_decay=0.05))
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


class DeviceBatches:
    """The raw loop's batches as an iterable for Lightning: one ``randperm`` per epoch from a generator seeded 0,
    moved to the data's device, batches gathered there (no DataLoader, no sampler, no host-side indices)."""

    def __init__(self, x: Any, y: Any, batch: int) -> None:
        import torch

        self.x, self.y, self.batch = x, y, batch
        self.generator = torch.Generator().manual_seed(0)

    def __len__(self) -> int:
        return (len(self.x) + self.batch - 1) // self.batch

    def __iter__(self) -> Any:
        import torch

        order = torch.randperm(len(self.x), generator=self.generator).to(self.x.device)
        for i in range(0, len(self.x), self.batch):
            idx = order[i:i + self.batch]
            yield self.x[idx], self.y[idx]


class BareModule(L.LightningModule):
    """Bare Lightning: the raw loop's network, loss, fused AdamW, schedule and clipping (the Trainer's
    ``gradient_clip_val``, applied by ``clip_grad_norm_`` as the raw loop does), nothing logged, no metrics."""

    def __init__(self, setting: str, size: dict[str, Any], channels_last: bool, total_steps: int) -> None:
        super().__init__()
        import torch

        torch.manual_seed(0)
        self.model = build_network(size)
        self.lr = size["lr"]
        self.channels_last = channels_last
        if channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.net = torch.compile(self.model) if setting == "compile" else self.model
        self.total_steps = total_steps

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        import torch
        import torch.nn.functional as F

        x, y = batch
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return F.cross_entropy(self.net(x), y)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        # Lightning's mixed-precision plugin refuses to clip for a fused optimizer even under bf16 (no GradScaler):
        # clip the gradients directly, as the raw loop and the recipe's task do
        import torch

        torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(gradient_clip_val or 0.0))

    def configure_optimizers(self) -> Any:
        import torch

        from lightning_modules.optim.optimizer_kernels import fused_where_supported
        from lightning_modules.optim.parameter_groups import param_groups
        from lightning_modules.optim.schedules import WarmupCosine

        optimizer = fused_where_supported(torch.optim.AdamW(param_groups(self.model), lr=self.lr, weight_decay=0.05))
        schedule = WarmupCosine(warmup_fraction=0.05).build(optimizer, self.total_steps, "", "min")
        return {"optimizer": optimizer, "lr_scheduler": schedule}


def run_lightning(setting: str, size: dict[str, Any], device_name: str,
                  profile: bool = False) -> list[tuple[int, float, int, int]]:
    """Bare Lightning for ``setting`` on the raw loop's device-resident data, timed by ``_common.LoopTimer``."""
    import torch

    cuda = device_name == "cuda"
    if cuda:
        torch.set_float32_matmul_precision("highest" if setting == "fp32" else "high")
    x, y = train_data(size, torch.device(device_name))
    batches = DeviceBatches(x, y, size["batch"])
    module = BareModule(setting, size, channels_last=cuda and setting != "fp32",
                        total_steps=len(batches) * size["epochs"])
    callbacks: list[Any] = [LoopTimer()] + ([ProfileWindow()] if profile else [])
    LoopTimer.reset()
    with quiet():
        trainer = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, max_epochs=size["epochs"],
                            precision="bf16-mixed" if cuda and setting != "fp32" else "32-true",
                            gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                            callbacks=callbacks, profiler=HookProfiler() if profile else None)
        trainer.fit(module, train_dataloaders=batches)
    return list(LoopTimer.epochs)


class HookProfiler(Profiler):
    """A Lightning profiler that, while ``ProfileWindow`` has ``torch.profiler`` on, opens a ``record_function``
    range named after each Lightning action (``[Callback]LoopTimer.on_train_batch_end``, ``run_training_batch``,
    ...) and adds up each action's host seconds; ``HookProfiler.report`` holds the last window's tables."""

    report: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        super().__init__()
        self.torch_profile: Any = None
        self.open: dict[str, tuple[float, Any]] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def start(self, action_name: str) -> None:
        if self.torch_profile is not None:
            import torch

            record = torch.profiler.record_function(action_name)
            record.__enter__()
            self.open[action_name] = (time.perf_counter(), record)

    def stop(self, action_name: str) -> None:
        started = self.open.pop(action_name, None)
        if started is not None:
            self.seconds[action_name] += time.perf_counter() - started[0]
            self.calls[action_name] += 1
            started[1].__exit__(None, None, None)

    def begin(self) -> None:
        """Turn ``torch.profiler`` on (CPU activities, no shapes) and start counting."""
        import torch

        self.seconds.clear()
        self.calls.clear()
        self.torch_profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                    record_shapes=False)
        self.torch_profile.__enter__()
        self.begun = time.perf_counter()

    def end(self, steps: int, device: Any) -> None:
        """Turn it off after ``steps`` training steps and keep the per-step tables in ``HookProfiler.report``."""
        host = time.perf_counter() - self.begun
        synchronize(device)
        synced = time.perf_counter() - self.begun
        profile, self.torch_profile = self.torch_profile, None
        for _, record in self.open.values():  # the hooks still running now (this one's callers)
            record.__exit__(None, None, None)
        self.open.clear()
        profile.__exit__(None, None, None)
        hooks = sorted(((name, self.seconds[name] / steps, self.calls[name] / steps) for name in self.seconds),
                       key=lambda row: -row[1])
        HookProfiler.report = {
            "steps": steps, "host_ms_per_step": 1e3 * host / steps, "synced_ms_per_step": 1e3 * synced / steps,
            "hooks_ms_per_step": [{"hook": n, "ms": 1e3 * t, "calls": c} for n, t, c in hooks],
            "table": profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=15,
                                                  max_name_column_width=72),
        }


class ProfileWindow(L.Callback):
    """Turns the trainer's ``HookProfiler`` on after batch B-1 of epoch ``PROFILE_WINDOW[0]`` and off after the
    following ``PROFILE_WINDOW[2]`` steps (fewer where the epoch is shorter; never its last, syncing batch)."""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        profiler = trainer.profiler
        epoch, first, steps = PROFILE_WINDOW
        n = trainer.num_training_batches
        first = min(first, max(1, n // 3))
        steps = min(steps, n - first - 1)
        if not isinstance(profiler, HookProfiler) or trainer.current_epoch != epoch or steps < 1:
            return
        if batch_idx == first - 1:
            profiler.begin()
        elif batch_idx == first - 1 + steps and profiler.torch_profile is not None:
            profiler.end(steps, pl_module.device)


def run_recipe(setting: str, size: dict[str, Any], device_name: str, workdir: Path,
               profile: bool = False) -> list[tuple[int, float, int, int]]:
    from _common import REPO
    from recipes.cli import main

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"gpu_{size['network']}.yaml"
    config.write_text(CONFIG.replace("N_SAMPLES", str(size["n_samples"])).replace("BATCH", str(size["batch"]))
                      .replace("SIDE", str(size.get("side", 32))).replace("LR", str(size["lr"]))
                      .replace("NETWORK", network_config(size)))  # last: its folder's name is not a placeholder
    args = ["fit", "-c", str(config), "--trainer.max_epochs", str(size["epochs"]),
            "--trainer.callbacks+=_common.LoopTimer"]
    if not profile:  # the profile window's end synchronises on purpose
        args.append("--trainer.callbacks+=_common.NoHostSyncs")
    if device_name == "cpu":
        args += ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true"]
    elif setting == "fp32":
        args += ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
                 "--float32_matmul_precision", "highest"]
    else:
        args += ["-c", str(REPO / "configs" / "trainer" / "gpu-bf16.yaml")]
    if setting == "compile":
        args += ["--model.init_args.compile", "true"]
    if profile:  # this module under the name it was imported as (__main__ as a script)
        args += ["--trainer.profiler", json.dumps({"class_path": f"{__name__}.HookProfiler"}),
                 f"--trainer.callbacks+={__name__}.ProfileWindow"]
    LoopTimer.reset()
    with in_directory(workdir), quiet():
        main(args)
    return list(LoopTimer.epochs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--network", choices=NETWORKS, default="convnet",
                        help="convnet (3x32x32), or resnet18 / vit_s (224 px, transformers networks with random "
                             "weights built here)")
    parser.add_argument("--steps", choices=["full", "small"], default="full", help="small: a tiny smoke run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settings", nargs="+", choices=["fp32", "bf16", "compile"], default=None)
    parser.add_argument("--loops", nargs="+", choices=LOOPS, default=LOOPS, help="the loops to time (default: all)")
    parser.add_argument("--profile", choices=["fp32", "bf16", "compile"], default=None,
                        help="time nothing: profile the host time per step, by hook, of the lightning and recipe "
                             "loops (or those of --loops) under this setting")
    parser.add_argument("--profile-out", type=Path, default=Path("gpu_profile.txt"),
                        help="the text file --profile writes (default: gpu_profile.txt)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    if cuda_missing("gpu", args.device, args.json, "--device cpu --steps small"):
        return 0
    small = args.steps == "small"
    size, warmup = sizes(small, args.network), sizes(True, args.network)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    with tempfile.TemporaryDirectory() as networks:
        if args.network != "convnet":
            save_hf_network(size, Path(networks) / "full")
            save_hf_network(warmup, Path(networks) / "warmup")
        if args.profile:
            return profile(args, size)
        return compare(args, size, warmup)


def compare(args: argparse.Namespace, size: dict[str, Any], warmup: dict[str, Any]) -> int:
    """The interleaved repetitions of every loop under every setting, their medians, ratios and targets."""
    small = args.steps == "small"
    settings = args.settings or (["fp32"] if args.device == "cpu" else ["fp32", "bf16", "compile"])
    if args.device == "cpu":
        settings = [s for s in settings if s == "fp32"]  # bf16 autocast and compile are GPU measurements here
    loops = [loop for loop in LOOPS if loop in args.loops]
    repeats = 1 if small else args.repeats
    print(f"gpu: {machine()}")
    print(f"  device {args.device}, settings {', '.join(settings)}, loops {', '.join(loops)}, {repeats} "
          f"repetition(s) x {size['epochs']} epochs of {size['n_samples']:,} samples (batch {size['batch']}, "
          f"{describe_network(size)})")
    rates: dict[str, dict[str, list[float]]] = {s: {loop: [] for loop in loops} for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        if not small:  # imports, MLflow schema, kernels
            run_recipe(settings[0], warmup, args.device, Path(tmp) / "warmup")
            if "lightning" in loops:
                run_lightning(settings[0], warmup, args.device)
        for rep in range(repeats):
            for setting in settings:
                for loop in loops:
                    if loop == "raw":
                        epochs = run_raw(setting, size, args.device)
                    elif loop == "lightning":
                        epochs = run_lightning(setting, size, args.device)
                    else:
                        epochs = run_recipe(setting, size, args.device, Path(tmp) / f"{setting}-{rep}")
                    rate, steps, seconds = throughput(epochs, skip=1)
                    rates[setting][loop].append(rate)
                    print(f"  rep {rep + 1}/{repeats} {setting:>7} {loop:>9}: {rate:9.0f} images/s "
                          f"({steps} steps in {seconds:.2f} s)", flush=True)
    print()
    rows, splits = [], []
    med = {s: {loop: median(v) for loop, v in by.items()} for s, by in rates.items()}
    for setting in settings:
        m = med[setting]
        if "raw" in m and "recipe" in m:
            ratio = m["recipe"] / m["raw"]
            verdict = "meets" if ratio >= RATIO_TARGET else "MISSES"
            if args.device == "cpu":
                verdict = "CPU smoke run: no verdict on"
            print(f"{setting:>7}: raw {m['raw']:9.0f} images/s, recipe {m['recipe']:9.0f} images/s, "
                  f"recipe / raw = {ratio:.3f} ({verdict} the >= {RATIO_TARGET} target)")
            rows.append({"setting": setting, "ratio": ratio, "met": ratio >= RATIO_TARGET})
        split: dict[str, Any] = {"setting": setting,
                                 "ms_per_step": {loop: 1e3 * size["batch"] / r for loop, r in m.items()}}
        parts = []
        for top, bottom, whose in (("recipe", "lightning", "loopwise's"), ("lightning", "raw", "Lightning's")):
            if top in m and bottom in m:
                key = f"{top}/{bottom}"
                split[key] = m[top] / m[bottom]
                split[f"{key} per repetition"] = [a / b for a, b in zip(rates[setting][top], rates[setting][bottom])]
                parts.append(f"{top} / {bottom} = {split[key]:.3f} ({whose} own cost; per repetition "
                             f"{', '.join(f'{v:.3f}' for v in split[f'{key} per repetition'])})")
        if parts:
            print(f"{setting:>7}: lightning {m['lightning']:9.0f} images/s, " + ", ".join(parts))
        steps_ms = ", ".join(f"{loop} {ms:.2f}" for loop, ms in split["ms_per_step"].items())
        print(f"{setting:>7}: ms per step (batch {size['batch']}, median): {steps_ms}")
        splits.append(split)
    if "bf16" in med and "fp32" in med and "recipe" in loops:
        speedup = med["bf16"]["recipe"] / med["fp32"]["recipe"]
        if args.network == "convnet":  # issue 33's target; the transformers networks' ratio is measured only
            verdict = "meets" if speedup >= BF16_TARGET else "MISSES"
            print(f"bf16 + channels_last / fp32 (recipe) = {speedup:.2f}x ({verdict} the >= {BF16_TARGET}x target)")
            rows.append({"setting": "bf16/fp32", "ratio": speedup, "met": speedup >= BF16_TARGET})
        else:
            print(f"bf16 + channels_last / fp32 (recipe) = {speedup:.2f}x (no target: measured)")
            rows.append({"setting": "bf16/fp32", "ratio": speedup, "met": None})
        if "raw" in loops:
            raw = med["bf16"]["raw"] / med["fp32"]["raw"]
            print(f"bf16 + channels_last / fp32 (raw loop) = {raw:.2f}x")
    elif args.device == "cpu":
        print("bf16 / fp32 target not checked on CPU (smoke run)")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "gpu", "network": args.network, "device": args.device,
                                         "images_per_s": med,
                                         "runs": rates, "rows": rows, "lightning_split": splits}, indent=2))
    return 0


def short(hook: str, width: int = 100) -> str:
    """A hook's name cut to ``width`` characters (a CallbackGroup's names all its callbacks)."""
    return hook if len(hook) <= width else hook[:width - 3] + "..."


def profile(args: argparse.Namespace, size: dict[str, Any]) -> int:
    """``--profile``: one fit of the lightning and the recipe loop each under one setting, 30 steps profiled."""
    setting = args.profile
    if args.device == "cpu" and setting != "fp32":
        print(f"gpu: --profile {setting} needs CUDA; profiling fp32 on CPU instead")
        setting = "fp32"
    loops = [loop for loop in ("lightning", "recipe") if loop in args.loops] or ["lightning", "recipe"]
    lines = [f"gpu --profile: {machine()}",
             f"  device {args.device}, setting {setting}, {size['n_samples']:,} samples (batch {size['batch']}, "
             f"{describe_network(size)}); epoch {PROFILE_WINDOW[0] + 1}, up to {PROFILE_WINDOW[2]} steps "
             f"from batch {PROFILE_WINDOW[1]}; torch.profiler CPU activities, record_shapes off"]
    print("\n".join(lines), flush=True)
    result: dict[str, Any] = {"benchmark": "gpu-profile", "device": args.device, "setting": setting}
    with tempfile.TemporaryDirectory() as tmp:  # no warm-up fit: the window is in the second epoch
        for loop in loops:
            HookProfiler.report = {}
            if loop == "lightning":
                run_lightning(setting, size, args.device, profile=True)
            else:
                run_recipe(setting, size, args.device, Path(tmp) / "profile", profile=True)
            report = HookProfiler.report
            if not report:
                block = [f"\n{loop} {setting}: no profile window (too few batches)"]
            else:
                block = [f"\n{loop} {setting}: {report['steps']} steps, host {report['host_ms_per_step']:.3f} ms/step, "
                         f"{report['synced_ms_per_step']:.3f} ms/step to the end of the GPU's work (profiler on)",
                         "  host time per step by Lightning hook (inclusive; ms, calls per step):"]
                block += [f"    {h['ms']:8.3f}  {h['calls']:4.1f}  {short(h['hook'])}"
                          for h in report["hooks_ms_per_step"][:15]]
                block += [f"  top 15 by self CPU time ({loop}, {setting}):", report["table"]]
            print("\n".join(block), flush=True)
            lines += block
            result[loop] = {k: v for k, v in report.items() if k != "table"}
    args.profile_out.write_text("\n".join(lines) + "\n")
    print(f"gpu --profile: written to {args.profile_out}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
