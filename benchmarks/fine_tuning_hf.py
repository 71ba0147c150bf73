"""Does fine-tuning a Hugging Face image model pay? A tiny ResNet pretrained on digits 0-4, fine-tuned on digits 5-9.

    python benchmarks/fine_tuning.py --network hf      # 5 seeds, prints the table, writes results/fine_tuning_hf.txt
    python benchmarks/fine_tuning_hf.py                # the same
    python benchmarks/fine_tuning_hf.py --quick --no-write   # 1 seed, short pretraining (the test's settings)

The issue 33 path, end to end, as a user runs it (``recipes`` commands in this process, each in its own folder with
its own ``mlflow.db``): scikit-learn's bundled 8x8 digits (no download), upscaled to 32x32 RGB PNG files in one
folder per class. A tiny ``transformers`` ResNet with random weights (seed 0) is saved with ``save_pretrained``
together with a ``ConvNextImageProcessor`` (the processor microsoft/resnet-50 ships): the "random-init directory".
Every run takes its preprocessing from that processor (``ImageFolderDataModule(image_processor=...)``; the exported
directory carries the same one); ``--no-processor`` normalizes with each run's train images instead.

1. Pretraining: ``recipes fit`` with ``ClassificationModule`` + ``HFImageClassifier(name_or_path=<random-init
   directory>)`` + ``ImageFolderDataModule`` on every image of digits 0-4 (``--pretrain-epochs`` 15, as the ConvNet
   benchmark; a val split of 10% picks the best checkpoint), then ``recipes export --ckpt_path best`` writes its
   network as a ``transformers`` directory (``config.id2label`` = ``0``..``4``) with the processor it was trained
   with.
2. Digits 5-9 (classes ``5``..``9``) are split once into a pool and a test folder (half of each digit, the same split
   as the ConvNet benchmark); each seed draws ``--per-class`` training images per class from the pool.
3. Every variant runs ``recipes fit`` on that seed's folder (``--per-class`` training and ``VAL_PER_CLASS`` val
   images of each digit: ``recipes fit`` needs a val split; the last checkpoint is scored, not the best), with the
   same optimizer (AdamW 3e-3, weight decay 1e-3, warmup + cosine), batches, epochs and seed, then ``recipes
   predict --ckpt_path last`` on the test folder; accuracy is the share of predicted class names equal to the
   image's folder:

   * ``scratch``: ``name_or_path`` = the random-init directory (a new 5-class head);
   * ``pretrained``: ``name_or_path`` = the exported directory (a new head: its labels ``0``..``4`` are not
     ``5``..``9``), everything trains;
   * ``pretrained + frozen``: the same, the backbone (``freeze: [backbone]``) frozen for the whole run: only the new
     head trains (a linear probe of the digits 0-4 features);
   * ``pretrained + unfreeze``: the backbone frozen for the first ``--unfreeze-at`` epochs (1), then unfrozen.

Printed: the test accuracy of each variant per seed, mean and spread, each variant minus ``scratch`` and on how many
seeds it beat ``scratch``. The runs are deterministic (``deterministic: true``, 1 torch thread): the same numbers come
back on every run on this machine.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts this checkout first on sys.path)
import numpy as np
import yaml

RESULTS = Path(__file__).resolve().parent / "results" / "fine_tuning_hf.txt"
IMAGE_SIZE = 32
HIDDEN_SIZES = [16, 32, 64]  # the tiny ResNet's stages (basic blocks, one per stage)
SOURCE_DIGITS = range(5)
TARGET_DIGITS = range(5, 10)
BACKBONE = "backbone"  # HFImageClassifier's part name for the transformers backbone (``model.resnet`` here)
VAL_PER_CLASS = 2  # val images per digit beside the training ones in a seed's fine-tuning folder
VARIANTS = ("scratch", "pretrained", "pretrained + frozen", "pretrained + unfreeze")
PRETRAIN_LR = 3e-3


# --- data ----------------------------------------------------------------------------------------------------------
def split_indices() -> dict[str, list[int]]:
    """Indices into scikit-learn's digits: all of digits 0-4 (``source``) and digits 5-9 split once into ``pool`` and
    ``test`` (half of each digit, the split of ``fine_tuning.py``'s ``split_target``)."""
    from sklearn.datasets import load_digits

    labels = load_digits().target
    rng = np.random.default_rng(0)
    pool: list[int] = []
    test: list[int] = []
    for digit in TARGET_DIGITS:
        where = np.flatnonzero(labels == digit)
        rng.shuffle(where)
        half = len(where) // 2
        pool.extend(where[:half].tolist())
        test.extend(where[half:].tolist())
    source = np.flatnonzero(labels < 5).tolist()
    return {"source": source, "pool": sorted(pool), "test": sorted(test)}


def draw_few(pool: list[int], per_class: int, seed: int) -> list[int]:
    """``per_class`` images of each digit of the pool, drawn with ``seed`` (as ``fine_tuning.py``'s ``draw_few``)."""
    from sklearn.datasets import load_digits

    labels = load_digits().target
    pool_array = np.asarray(pool)
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(pool_array[labels[pool_array] == d], per_class, replace=False) for d in TARGET_DIGITS]
    return sorted(np.concatenate(chosen).tolist())


def write_images(root: Path, indices: list[int]) -> Path:
    """The digits at ``indices``, upscaled with Pillow's bilinear filter to ``IMAGE_SIZE`` RGB PNG files in
    ``root/<digit>/<index>.png`` (as ``tests/hf_image_models.py``'s ``digits_folder``, which writes every image of a
    digit or a random draw: this benchmark needs fixed index lists)."""
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    for index in indices:
        folder = root / str(int(data.target[index]))
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (data.images[index] * (255.0 / 16.0)).round().astype(np.uint8)
        image = Image.fromarray(pixels).resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
        image.convert("RGB").save(folder / f"{index:04d}.png")
    return root


# --- the network -----------------------------------------------------------------------------------------------------
def build_random_resnet(directory: Path, seed: int = 0) -> Path:
    """A tiny ``ResNetForImageClassification`` (basic blocks, ``HIDDEN_SIZES``, 3 channels, 5 outputs) with random
    weights drawn with ``seed``, and a ``ConvNextImageProcessor`` (the class microsoft/resnet-50 ships:
    ``shortest_edge`` 32, ``crop_pct`` 0.875, the class's default mean and std of 0.5), both saved with
    ``save_pretrained``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.ResNetConfig(
        num_channels=3, embedding_size=HIDDEN_SIZES[0], hidden_sizes=HIDDEN_SIZES, depths=[1] * len(HIDDEN_SIZES),
        layer_type="basic", num_labels=5,
    )
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its warning about the PIL fallback (torchvision is not installed)
    try:
        with _common.quiet():  # the shard-writing progress bar
            processor = transformers.ConvNextImageProcessor(size={"shortest_edge": IMAGE_SIZE}, crop_pct=0.875)
            directory.mkdir(parents=True, exist_ok=True)
            transformers.ResNetForImageClassification(config).save_pretrained(directory)
            processor.save_pretrained(directory)
    finally:
        transformers.logging.set_verbosity(verbosity)
    return directory


# --- recipe runs -----------------------------------------------------------------------------------------------------
def recipe(name_or_path: Path, root: Path, seed: int, epochs: int, batch_size: int, lr: float, val_fraction: float,
           processor: Path | None, fine_tuning: dict[str, Any]) -> dict[str, Any]:
    """The recipe's YAML as a dict: ``ClassificationModule`` + ``HFImageClassifier`` + ``ImageFolderDataModule``."""
    data: dict[str, Any] = {"root": str(root), "image_size": IMAGE_SIZE, "channels": 3, "batch_size": batch_size,
                            "val_fraction": val_fraction, "seed": seed}
    if processor is not None:
        data["image_processor"] = str(processor)
    return {
        "seed_everything": seed,
        "torch_threads": 1,
        "trainer": {"max_epochs": epochs, "gradient_clip_val": 1.0, "log_every_n_steps": 5, "deterministic": True,
                    "enable_progress_bar": False},
        "model": {"class_path": "lightning_modules.ClassificationModule", "init_args": {
            "model": {"class_path": "lightning_modules.models.HFImageClassifier",
                      "init_args": {"name_or_path": str(name_or_path)}},
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": lr, "weight_decay": 1e-3}},
            "schedule": {"class_path": "lightning_modules.optim.WarmupCosine", "init_args": {"warmup_fraction": 0.1}},
            **fine_tuning,
        }},
        "data": {"class_path": "datamodules.ImageFolderDataModule", "init_args": data},
    }


def run_recipe(workdir: Path, args: list[str]) -> None:
    """``recipes <args>`` in this process, in ``workdir`` (its own ``mlflow.db`` and checkpoints), output swallowed;
    a failure raises with the command."""
    from recipes.cli import main

    errors = io.StringIO()
    with _common.in_directory(workdir), _common.quiet(), contextlib.redirect_stderr(errors):
        try:
            main(args)
        except SystemExit as stop:
            if stop.code not in (0, None):
                last = (errors.getvalue().strip().splitlines() or ["(no message)"])[-1]
                raise RuntimeError(f"recipes {' '.join(args)} exited {stop.code} in {workdir}: {last}") from None


def fit(workdir: Path, config: dict[str, Any], checkpoints: Path | None = None) -> Path:
    """``recipes fit`` of ``config`` in ``workdir``; its config file."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "recipe.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_recipe(workdir, ["fit", "-c", str(path)])
    return path


def accuracy_on(workdir: Path, config: Path, ckpt: str, folder: Path) -> float:
    """``recipes predict --ckpt_path <ckpt>`` on every image under ``folder``; the share whose predicted class name is
    the image's folder name."""
    out = workdir / "predictions.csv"
    run_recipe(workdir, ["predict", "-c", str(config), "--ckpt_path", ckpt,
                         "--data.init_args.predict_path", str(folder), "--predictions_path", str(out)])
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        raise RuntimeError(f"recipes predict wrote no rows to {out}")
    return sum(Path(row["path"]).parent.name == row["prediction"] for row in rows) / len(rows)


def export(workdir: Path, config: Path, directory: Path) -> Path:
    """The best checkpoint's network of the fit in ``workdir`` as a ``transformers`` directory with its image
    processor (``recipes export``)."""
    run_recipe(workdir, ["export", "-c", str(config), "--ckpt_path", "best", "--export_dir", str(directory)])
    return directory


def variants(unfreeze_at: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each variant: which directory it starts from and its ``ClassificationModule`` fine-tuning arguments."""
    return {
        "scratch": ("random", {}),
        "pretrained": ("pretrained", {}),
        "pretrained + frozen": ("pretrained", {"freeze": [BACKBONE]}),
        "pretrained + unfreeze": ("pretrained", {"freeze": [BACKBONE], "unfreeze_at_epoch": unfreeze_at}),
    }


def run(seeds: int, per_class: int, epochs: int, batch_size: int, pretrain_epochs: int, lr: float,
        names: list[str] | None, use_processor: bool, workdir: Path, unfreeze_at: int = 1) -> dict[str, Any]:
    """Pretrain once, then every variant (or those in ``names``) on every seed (interleaved: seed by seed)."""
    split = split_indices()
    folders = {"source": write_images(workdir / "digits_0_4", split["source"]),
               "test": write_images(workdir / "digits_5_9_test", split["test"])}
    random_dir = build_random_resnet(workdir / "random_init")
    processor = random_dir if use_processor else None
    started = time.perf_counter()
    pretrain_dir = workdir / "pretrain"
    config = fit(pretrain_dir, recipe(random_dir, folders["source"], 0, pretrain_epochs, 64, PRETRAIN_LR, 0.1,
                                      processor, {}))
    pretrained_dir = export(pretrain_dir, config, workdir / "pretrained_0_4")
    pretrain_seconds = time.perf_counter() - started
    source_accuracy = accuracy_on(pretrain_dir, config, "best", folders["source"])
    starts = {"random": random_dir, "pretrained": pretrained_dir}
    chosen = {k: v for k, v in variants(unfreeze_at).items() if names is None or k in names}
    results: dict[str, list[float]] = {name: [] for name in chosen}
    seconds: dict[str, list[float]] = {name: [] for name in chosen}
    for seed in range(seeds):
        drawn = draw_few(split["pool"], per_class + VAL_PER_CLASS, seed)
        train = write_images(workdir / f"digits_5_9_seed{seed}", drawn)
        val_fraction = VAL_PER_CLASS / (per_class + VAL_PER_CLASS)
        for number, (name, (start, fine_tuning)) in enumerate(chosen.items()):
            began = time.perf_counter()
            where = workdir / f"seed{seed}_variant{number}"
            config = fit(where, recipe(starts[start], train, seed, epochs, batch_size, lr, val_fraction, processor,
                                       fine_tuning))
            results[name].append(accuracy_on(where, config, "last", folders["test"]))
            seconds[name].append(time.perf_counter() - began)
    return {"accuracies": results, "seconds": seconds, "pretrain_seconds": pretrain_seconds,
            "source_accuracy": source_accuracy,
            "test_images": len(split["test"]), "source_images": len(split["source"]), "train_images": 5 * per_class,
            "epochs": epochs, "steps": epochs * -(-5 * per_class // batch_size), "pretrain_epochs": pretrain_epochs}


def table(result: dict[str, Any], seeds: int) -> str:
    accuracies = result["accuracies"]
    scratch_values = accuracies.get("scratch", [])
    scratch = statistics.mean(scratch_values) if scratch_values else float("nan")
    lines = [
        f"digits 5-9 from {result['train_images']} training images ({result['train_images'] // 5} per class), "
        f"{result['steps']} optimizer steps ({result['epochs']} epochs), {seeds} seeds; test folder "
        f"{result['test_images']} images",
        f"pretrained network: transformers ResNet {HIDDEN_SIZES} (basic blocks) fitted with `recipes fit` on the "
        f"{result['source_images']} images of digits 0-4 for {result['pretrain_epochs']} epochs (accuracy "
        f"{result['source_accuracy']:.4f} there), best checkpoint written with `recipes export` "
        f"({result['pretrain_seconds']:.0f} s)",
        "",
        "| variant | test acc per seed | mean | spread (max - min) | mean - scratch | seeds above scratch |",
        "|---|---|---|---|---|---|",
    ]
    for name, values in accuracies.items():
        mean = statistics.mean(values)
        per_seed = " ".join(f"{v:.3f}" for v in values)
        above = sum(v > s for v, s in zip(values, scratch_values))
        wins = f"{above} of {len(values)}" if scratch_values and name != "scratch" else "-"
        lines.append(f"| {name} | {per_seed} | **{mean:.4f}** | {max(values) - min(values):.3f} | "
                     f"{mean - scratch:+.4f} | {wins} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--per-class", type=int, default=10, help="training images per class (at most 89 here)")
    parser.add_argument("--epochs", type=int, default=12, help="fine-tuning epochs of every variant")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--lr", type=float, default=3e-3, help="fine-tuning learning rate (pretraining: 3e-3)")
    parser.add_argument("--unfreeze-at", type=int, default=1, help="epoch the unfreeze variant unfreezes at")
    parser.add_argument("--pretrain-epochs", type=int, default=15, help="as fine_tuning.py's ConvNet")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=None, help="a subset (default: all)")
    parser.add_argument("--no-processor", action="store_true",
                        help="normalize with the train images' statistics instead of the model's image processor")
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 pretraining epochs, 4 fine-tuning epochs")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the folders, runs and models here")
    parser.add_argument("--no-write", action="store_true", help="do not write results/fine_tuning_hf.txt")
    parser.add_argument("--json", type=Path, help="write the accuracies to this JSON file")
    args = parser.parse_args(argv)
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: name a new or empty folder (its runs would mix with "
                     "those already there)")
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # every run in its own folder's mlflow.db, never a team's server
    if args.quick:
        args.seeds, args.pretrain_epochs, args.epochs = 1, 2, 4
    with tempfile.TemporaryDirectory(prefix="loopwise-fine-tuning-hf-") as tmp:
        workdir = args.workdir or Path(tmp)
        result = run(args.seeds, args.per_class, args.epochs, args.batch_size, args.pretrain_epochs, args.lr,
                     args.variants, not args.no_processor, workdir.resolve(), args.unfreeze_at)
    text = table(result, args.seeds)
    print(text)
    if not args.no_write:
        RESULTS.write_text(f"{_common.machine()}\n\n{text}\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
