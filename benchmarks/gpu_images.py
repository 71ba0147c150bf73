"""Fine-tuning Hugging Face image classifiers through the recipe on a GPU: images/s, fp32 vs bf16, channels_last.

    python benchmarks/gpu_images.py                       # on a CUDA GPU (~2-3 min on an H100)
    python benchmarks/gpu_images.py --device cpu --small  # smoke run on CPU: tiny models, fp32 only, no ratios

Two networks with random weights (built from their configs and saved with ``save_pretrained`` into a temporary
folder with the image processor their hub models ship; nothing is downloaded), each fine-tuned by ``recipes fit``
in this process as ``lightning_modules.models.HFImageClassifier`` (``name_or_path``, sizes and classes linked from
the data) on a generated folder of random-texture PNG images (``ImageFolderDataModule``, ``cache: true``, loader
workers, the model's ``image_processor`` where the data module takes one, else ``image_size``):

  resnet    ResNet-18 shaped ``ResNetConfig`` (basic blocks, depths [2, 2, 2, 2], widths [64, 128, 256, 512]),
            ``ConvNextImageProcessor`` (shortest edge 224, crop_pct 0.875) as microsoft/resnet-18 ships
  vit       ViT-Small-ish ``ViTConfig`` (224 px, patch 16, width 384, 6 layers, 6 heads), ``ViTImageProcessor``

Settings, interleaved over repetitions (model x setting, then again):

  fp32        float32 (``float32_matmul_precision`` "highest": no TF32)
  bf16        ``-c configs/trainer/gpu-bf16.yaml``: bf16-mixed autocast, channels_last, TF32 matmuls
  bf16-nocl   the same with ``--model.init_args.channels_last false`` (ResNet only: what channels_last brings)
  bf16-aug    bf16 with the recipe's batch augmentation on (ResNet only; ``batch_augmentation`` random resized
              crop (scale 0.6-1) and colour jitter 0.2, flip 0, as in configs/image_finetune_hf.yaml; not run unless
              ``--settings`` names it: what the augmentation on the GPU costs a step)

Timed: the training batches of epochs 2..N (``_common.LoopTimer``); medians over the repetitions; ratios bf16 / fp32
per network and, for the ResNet, channels_last on / off and batch augmentation on / off under bf16. ``loader`` is
the data loader alone (the same data module, batches moved to the device, no model) in images/s: the ceiling the
loader puts on every setting.
On CUDA a first, untimed 1-epoch bf16 fit of each network runs with ``_common.NoHostSyncs`` and reports the first
host-device synchronisation inside an ordinary training batch, if any (it does not stop the benchmark); with
``bf16-aug`` chosen, a bf16-aug fit of the ResNet is checked the same way.
Without CUDA the script says so and exits 0 unless ``--device cpu`` asks for the smoke run.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from _common import (
    LoopTimer,
    REPO,
    cuda_missing,
    in_directory,
    machine,
    median,
    quiet,
    set_threads,
    synchronize,
    throughput,
)

CLASSES = 4
SETTINGS = {"resnet": ["fp32", "bf16", "bf16-nocl", "bf16-aug"], "vit": ["fp32", "bf16"]}
DEFAULT_SETTINGS = ["fp32", "bf16", "bf16-nocl"]
# configs/image_finetune_hf.yaml's batch augmentation (random resized crop, no flip, colour jitter)
AUGMENTATION = {"class_path": "datamodules.BatchAugmentation",
                "init_args": {"crop_scale": [0.6, 1.0], "flip": 0.0, "brightness": 0.2, "contrast": 0.2,
                              "saturation": 0.2}}

CONFIG = """\
seed_everything: 0
trainer:
  max_epochs: 2
  gradient_clip_val: 1.0
  log_every_n_steps: 50
  num_sanity_val_steps: 0
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    model:
      class_path: lightning_modules.models.HFImageClassifier
      init_args: {name_or_path: MODEL_DIR}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: 0.0003, weight_decay: 0.05}
    schedule:
      class_path: lightning_modules.optim.WarmupCosine
      init_args: {warmup_fraction: 0.1}
data:
  class_path: datamodules.ImageFolderDataModule
  init_args: {root: ROOT, cache: true, batch_size: BATCH, num_workers: WORKERS, val_fraction: 0.125, seed: 0,
              IMAGE_ARGS}
"""


def sizes(small: bool) -> dict[str, Any]:
    """Image side, images per class, batch, epochs, loader workers and network sizes of a full or a smoke run."""
    if small:
        return {"side": 32, "per_class": 16, "batch": 16, "epochs": 2, "workers": 0,
                "resnet": {"embedding_size": 8, "hidden_sizes": [8, 16], "depths": [1, 1]},
                "vit": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
                        "patch_size": 8}}
    return {"side": 224, "per_class": 384, "batch": 128, "epochs": 4, "workers": 8,
            "resnet": {"embedding_size": 64, "hidden_sizes": [64, 128, 256, 512], "depths": [2, 2, 2, 2]},
            "vit": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 1536,
                    "patch_size": 16}}


def build_models(directory: Path, size: dict[str, Any]) -> dict[str, Path]:
    """The two networks with random weights (seed 0) and their processors, saved with ``save_pretrained``."""
    import torch
    import transformers

    side = size["side"]
    labels = {i: f"pretrained{i}" for i in range(10)}  # a 10-class "pretrained" head: the recipe replaces it
    common = {"num_channels": 3, "id2label": labels, "label2id": {v: k for k, v in labels.items()}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the PIL fallback of the processors where torchvision is missing
        torch.manual_seed(0)
        built = {
            "resnet": (transformers.ResNetForImageClassification(transformers.ResNetConfig(
                layer_type="basic", **size["resnet"], **common)),
                transformers.ConvNextImageProcessor(size={"shortest_edge": side}, crop_pct=0.875, resample=3,
                                                    image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])),
        }
        torch.manual_seed(0)
        built["vit"] = (transformers.ViTForImageClassification(transformers.ViTConfig(
            image_size=side, **size["vit"], **common)),
            transformers.ViTImageProcessor(size={"height": side, "width": side}))
    paths = {}
    for name, (model, processor) in built.items():
        paths[name] = directory / name
        model.save_pretrained(paths[name])
        processor.save_pretrained(paths[name])
    return paths


def make_image_folder(root: Path, per_class: int, side: int) -> Path:
    """``CLASSES`` sub-folders of ``per_class`` RGB PNG files each: smooth random textures (coarse noise upsampled
    bilinearly) tinted per class, so the task is learnable and the files compress like photographs, not noise.
    One process per class (seeded by the class: the same files every time)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(CLASSES, os.cpu_count() or 1)) as pool:
        list(pool.map(write_class, [(root, label, per_class, side) for label in range(CLASSES)]))
    return root


def write_class(job: tuple[Path, int, int, int]) -> None:
    import numpy as np
    from PIL import Image

    root, label, per_class, side = job
    rng = np.random.default_rng(label)
    coarse = max(2, side // 16)
    folder = root / f"class{label}"
    folder.mkdir(parents=True, exist_ok=True)
    tint = np.zeros(3)
    tint[label % 3] = 60.0 if label < 3 else -60.0
    for i in range(per_class):
        noise = (rng.random((coarse, coarse, 3)) * 195 + 30 + tint).clip(0, 255).astype(np.uint8)
        Image.fromarray(noise).resize((side, side), Image.BILINEAR).save(folder / f"{i:04d}.png", compress_level=1)


PROCESSOR_ERRORS: dict[str, str] = {}


def data_args(model_dir: Path, side: int, root: Path) -> str:
    """The data module's image arguments: the model's processor where ``ImageFolderDataModule`` takes one and
    accepts it, else ``image_size`` (the refusal is printed once and kept in ``PROCESSOR_ERRORS``)."""
    from datamodules import ImageFolderDataModule

    if "image_processor" not in inspect.signature(ImageFolderDataModule.__init__).parameters:
        return f"image_size: {side}"
    if str(model_dir) not in PROCESSOR_ERRORS:
        try:
            ImageFolderDataModule(root=str(root), image_processor=str(model_dir))
            PROCESSOR_ERRORS[str(model_dir)] = ""
        except ValueError as err:
            PROCESSOR_ERRORS[str(model_dir)] = str(err)
            print(f"  image_processor refused, image_size: {side} instead: {err}", flush=True)
    return f"image_size: {side}" if PROCESSOR_ERRORS[str(model_dir)] else f"image_processor: {model_dir}"


def setting_args(setting: str, device: str) -> list[str]:
    """The trainer (and augmentation) arguments of ``setting``; on CPU fp32 always (with the augmentation of
    ``bf16-aug``: a smoke run of its path)."""
    augment = ["--data.init_args.batch_augmentation", json.dumps(AUGMENTATION)] if setting.endswith("-aug") else []
    if device == "cpu":
        return ["--trainer.accelerator", "cpu", "--trainer.precision", "32-true", *augment]
    if setting == "fp32":
        return ["--trainer.accelerator", "gpu", "--trainer.devices", "1", "--trainer.precision", "32-true",
                "--float32_matmul_precision", "highest"]
    args = ["-c", str(REPO / "configs" / "trainer" / "gpu-bf16.yaml")]
    return args + (["--model.init_args.channels_last", "false"] if setting == "bf16-nocl" else []) + augment


def run_fit(model: str, setting: str, context: dict[str, Any], workdir: Path, epochs: int,
            sync_check: bool = False) -> list[tuple[int, float, int, int]]:
    """``recipes fit`` in this process; the per-epoch (epoch, seconds, images, steps) of its training batches."""
    from recipes.cli import main

    size = context["size"]
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"{model}.yaml"
    config.write_text(CONFIG.replace("MODEL_DIR", str(context["models"][model])).replace("ROOT", str(context["root"]))
                      .replace("BATCH", str(size["batch"])).replace("WORKERS", str(size["workers"]))
                      .replace("IMAGE_ARGS", data_args(context["models"][model], size["side"], context["root"])))
    args = ["fit", "-c", str(config), *setting_args(setting, context["device"]), "--trainer.max_epochs", str(epochs),
            "--trainer.callbacks+=_common.LoopTimer"]
    if sync_check:
        args.append("--trainer.callbacks+=_common.NoHostSyncs")
    LoopTimer.reset()
    with in_directory(workdir), quiet():
        main(args)
    return list(LoopTimer.epochs)


def loader_rate(context: dict[str, Any], epochs: int) -> float:
    """Images/s of the train loader alone (ResNet's preprocessing), batches moved to the device, epochs 2..N."""
    import torch

    from datamodules import ImageFolderDataModule

    size, device = context["size"], torch.device(context["device"])
    extra = data_args(context["models"]["resnet"], size["side"], context["root"]).split(": ", 1)
    dm = ImageFolderDataModule(root=str(context["root"]), cache=True, batch_size=size["batch"],
                               num_workers=size["workers"], val_fraction=0.125, seed=0,
                               **{extra[0]: extra[1] if extra[0] == "image_processor" else int(extra[1])})
    dm.setup("fit")
    loader = dm.train_dataloader()  # once, as Lightning does: its workers persist across epochs
    timings = []
    for epoch in range(epochs):
        images, start = 0, time.perf_counter()
        for x, _ in loader:
            x = x.to(device, non_blocking=True)
            images += x.shape[0]
        synchronize(device)
        timings.append((epoch, time.perf_counter() - start, images, 0))
    return throughput(timings, skip=1)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny models and images: a smoke run")
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repetitions of every model x setting")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per fit (the first is not timed)")
    parser.add_argument("--per-class", type=int, default=None, help="generated images per class (4 classes)")
    parser.add_argument("--models", nargs="+", choices=sorted(SETTINGS), default=["resnet", "vit"])
    parser.add_argument("--settings", nargs="+", choices=sorted({s for v in SETTINGS.values() for s in v}),
                        default=DEFAULT_SETTINGS, help=f"the settings to time (default: {' '.join(DEFAULT_SETTINGS)}; "
                        "each model runs those it has; on CPU fp32 only, and bf16-aug as fp32 with the augmentation)")
    parser.add_argument("--no-sync-check", action="store_true", help="skip the untimed NoHostSyncs fit (CUDA)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="start no new repetition after this many seconds (the medians use what was measured)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    import torch

    if cuda_missing("gpu_images", args.device, args.json, "--device cpu --small"):
        return 0
    size = sizes(args.small)
    size["epochs"] = args.epochs or size["epochs"]
    size["per_class"] = args.per_class or size["per_class"]
    repeats = 1 if args.small else args.repeats
    variants = [(m, s) for m in args.models for s in SETTINGS[m]
                if s in args.settings and (args.device == "cuda" or s in ("fp32", "bf16-aug"))]
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"gpu_images: {machine()}")
    print(f"  device {args.device}, {repeats} repetition(s) x {size['epochs']} epochs of {CLASSES}x{size['per_class']} "
          f"{size['side']}x{size['side']} images (batch {size['batch']}, {size['workers']} loader workers); "
          f"{', '.join(f'{m} {s}' for m, s in variants)}", flush=True)
    rates: dict[str, dict[str, list[float]]] = {m: {s: [] for s in SETTINGS[m] if s in args.settings}
                                                for m in args.models}
    result: dict[str, Any] = {"benchmark": "gpu_images", "device": args.device, "machine": machine(),
                              "size": {k: size[k] for k in ("side", "per_class", "batch", "epochs", "workers")}}
    begun = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        context = {"size": size, "device": args.device, "models": build_models(Path(tmp) / "models", size),
                   "root": make_image_folder(Path(tmp) / "images", size["per_class"], size["side"])}
        print(f"  models and {CLASSES * size['per_class']} images written in {time.perf_counter() - started:.1f} s")
        result["loader_images_per_s"] = loader_rate(context, max(2, min(size["epochs"], 3)))
        print(f"  loader alone (resnet preprocessing, to {args.device}): {result['loader_images_per_s']:9.0f} images/s",
              flush=True)
        save(args.json, result)
        if args.device == "cuda" and not args.no_sync_check:
            result["host_syncs"] = {}
            checks = [(m, "bf16") for m in args.models] + [(m, s) for m, s in variants if s == "bf16-aug"]
            for model, setting in checks:
                try:
                    run_fit(model, setting, context, Path(tmp) / f"sync-{model}-{setting}", epochs=1,
                            sync_check=True)
                    found = "none"
                except BaseException as err:  # noqa: BLE001 (the sync error, or SystemExit of the recipe)
                    if isinstance(err, KeyboardInterrupt):
                        raise
                    found = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                finally:
                    torch.cuda.set_sync_debug_mode("default")  # an error inside a batch leaves "error" set
                result["host_syncs"][model if setting == "bf16" else f"{model} {setting}"] = found
                print(f"  host syncs in ordinary {setting} training batches, {model}: {found}", flush=True)
                save(args.json, result)
        measuring = time.perf_counter()
        for rep in range(repeats):
            per_rep = (time.perf_counter() - measuring) / max(rep, 1)
            if rep and args.max_seconds and time.perf_counter() - begun + per_rep > args.max_seconds:
                print(f"  --max-seconds {args.max_seconds:.0f}: another repetition ({per_rep:.0f} s) would pass it; "
                      f"{rep} of {repeats} measured")
                result["repetitions"] = rep
                break
            for model, setting in variants:
                started = time.perf_counter()
                try:
                    epochs = run_fit(model, setting, context, Path(tmp) / f"{model}-{setting}-{rep}", size["epochs"])
                except (Exception, SystemExit) as err:  # one failing setting does not cost the others
                    message = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0]}"[:300]
                    print(f"  rep {rep + 1}/{repeats} {model:>6} {setting:>9}: FAILED {message}", flush=True)
                    result.setdefault("errors", []).append({"model": model, "setting": setting, "error": message})
                    continue
                rate, steps, seconds = throughput(epochs, skip=1)
                rates[model][setting].append(rate)
                print(f"  rep {rep + 1}/{repeats} {model:>6} {setting:>9}: {rate:8.0f} images/s ({steps} steps in "
                      f"{seconds:.2f} s; fit {time.perf_counter() - started:.1f} s)", flush=True)
                result["runs"] = rates
                save(args.json, result)  # what is measured so far survives a timeout
    print()
    med = {m: {s: median(v) for s, v in by.items() if v} for m, by in rates.items()}
    ratios = []
    for model in args.models:
        line = ", ".join(f"{s} {r:.0f}" for s, r in med[model].items())
        print(f"{model}: images/s (median of {max(len(v) for v in rates[model].values())}): {line}")
        pairs = [("bf16", "fp32", "bf16 / fp32"), ("bf16", "bf16-nocl", "channels_last on / off (bf16)"),
                 ("bf16-aug", "bf16", "batch augmentation on / off (bf16)")]
        for top, bottom, what in pairs:
            if top in med[model] and bottom in med[model]:
                ratio = med[model][top] / med[model][bottom]
                spread = [a / b for a, b in zip(rates[model][top], rates[model][bottom])]
                print(f"{model}: {what} = {ratio:.2f}x (per repetition: {', '.join(f'{s:.2f}' for s in spread)})")
                ratios.append({"model": model, "ratio": what, "value": ratio, "per_repetition": spread})
    if args.device == "cpu":
        print("gpu_images: CPU smoke run: fp32 only, no ratios")
    result.update({"images_per_s": med, "runs": rates, "ratios": ratios,
                   "image_processor_refused": {Path(k).name: v for k, v in PROCESSOR_ERRORS.items() if v}})
    save(args.json, result)
    return 0


def save(path: Path | None, result: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    sys.exit(main())
