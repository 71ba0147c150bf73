"""Does fine-tuning pay? A ConvNet pretrained on digits 0-4, fine-tuned on digits 5-9 from 10 images per class.

    python benchmarks/fine_tuning.py                  # 5 seeds, prints the table, writes results/fine_tuning.txt
    python benchmarks/fine_tuning.py --per-class 20 --steps 150 --batch-size 20   # more data, longer
    python benchmarks/fine_tuning.py --quick          # 2 seeds, 4 pretraining epochs, scratch and pretrained only
    python benchmarks/fine_tuning.py --network hf     # a Hugging Face ResNet through the recipes (fine_tuning_hf.py)

scikit-learn's bundled 8x8 digits (no download). The pretrained network is loopwise's ``ConvNet`` trained once
(seed 0) with ``ClassificationModule`` on every image of digits 0-4, its weights saved with ``torch.save`` as a user
would. Digits 5-9 (as classes 0-4) are split once into a pool and a test set (half each, stratified); each seed draws
``--per-class`` training images per class from the pool. Every variant then trains the same network, with the same
optimizer, schedule, batches and number of optimizer steps, and is scored on the same test set:

* ``scratch``: random initial weights;
* ``pretrained``: ``init_from`` the saved weights (the head left out: ``exclude: [head]``), everything trains;
* ``pretrained + frozen``: the stem and first stage frozen (their batch norms in eval mode), the rest trains;
* ``pretrained + lr x0.1``: ``lr_multipliers`` 0.1 on the stem and stages, the head at the full rate;
* ``pretrained + unfreeze``: stem and stages frozen for the first half of the epochs, then unfrozen.

Printed: the test accuracy of each variant per seed, mean and spread, and each variant minus ``scratch``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _common  # noqa: F401  (puts this checkout first on sys.path)
import lightning as L
import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.fine_tuning.initial_weights import InitialWeights
from lightning_modules.models import ConvNet
from lightning_modules.optim.schedules import WarmupCosine

RESULTS = Path(__file__).resolve().parent / "results" / "fine_tuning.txt"
WIDTHS = [32, 64]
BACKBONE = ["stem", "stages"]


def digits_tensors() -> tuple[torch.Tensor, torch.Tensor]:
    """All 1,797 images as (N, 1, 8, 8) floats in [0, 1] (pixel / 16, a fixed scale: no statistics) and labels."""
    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    return images, torch.tensor(data.target, dtype=torch.long)


def split_target(images: torch.Tensor, labels: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Digits 0-4 (source, all of them) and digits 5-9 as classes 0-4, split once into pool and test (half each)."""
    source = labels < 5
    rng = np.random.default_rng(0)
    pool: list[int] = []
    test: list[int] = []
    for digit in range(5, 10):
        where = np.flatnonzero(labels.numpy() == digit)
        rng.shuffle(where)
        half = len(where) // 2
        pool.extend(where[:half].tolist())
        test.extend(where[half:].tolist())
    pool_t, test_t = torch.tensor(sorted(pool)), torch.tensor(sorted(test))
    return {
        "source": (images[source], labels[source]),
        "pool": (images[pool_t], labels[pool_t] - 5),
        "test": (images[test_t], labels[test_t] - 5),
    }


def draw_few(pool: tuple[torch.Tensor, torch.Tensor], per_class: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` images of each class from the pool, drawn with ``seed``."""
    images, labels = pool
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(np.flatnonzero(labels.numpy() == c), per_class, replace=False) for c in range(5)]
    index = torch.tensor(np.sort(np.concatenate(chosen)))
    return images[index], labels[index]


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    options = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                   deterministic=True, accelerator="cpu")
    return L.Trainer(**{**options, **kwargs})


def loader(data: tuple[torch.Tensor, torch.Tensor], batch_size: int, shuffle: bool, seed: int = 0) -> DataLoader:
    generator = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(*data), batch_size=batch_size, shuffle=shuffle, generator=generator)


def adamw(lr: float):
    def build(params: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=lr, weight_decay=1e-3)

    return build


def pretrain(source: tuple[torch.Tensor, torch.Tensor], epochs: int, path: Path) -> float:
    """Train the network on digits 0-4 and save its weights; returns its accuracy on those images."""
    L.seed_everything(0, verbose=False)
    task = ClassificationModule(ConvNet(1, 5, WIDTHS, dropout=0.1), num_classes=5, optimizer=adamw(3e-3),
                                schedule=WarmupCosine(warmup_fraction=0.05))
    quiet_trainer(max_epochs=epochs).fit(task, loader(source, 64, shuffle=True))
    torch.save(task.model.state_dict(), path)
    return accuracy(task, source)


@torch.no_grad()
def accuracy(task: ClassificationModule, data: tuple[torch.Tensor, torch.Tensor]) -> float:
    task.eval()
    predictions = task(data[0]).argmax(dim=1)
    return float((predictions == data[1]).float().mean())


def variants(weights: Path, epochs: int) -> dict[str, dict[str, Any]]:
    """The fine-tuning arguments of each variant (beside the same network, optimizer and schedule)."""
    start = InitialWeights(str(weights), exclude=["head"])
    return {
        "scratch": {},
        "pretrained": {"init_from": start},
        "pretrained + frozen": {"init_from": start, "freeze": ["stem", "stages.0"]},
        "pretrained + lr x0.1": {"init_from": start, "lr_multipliers": {"stem": 0.1, "stages": 0.1}},
        "pretrained + unfreeze": {"init_from": start, "freeze": BACKBONE, "unfreeze_at_epoch": max(1, epochs // 2)},
    }


def fine_tune(train: tuple[torch.Tensor, torch.Tensor], test: tuple[torch.Tensor, torch.Tensor], seed: int,
              steps: int, batch_size: int, arguments: dict[str, Any]) -> float:
    """Train one variant for exactly ``steps`` optimizer steps; its accuracy on the test set."""
    L.seed_everything(seed, verbose=False)
    task = ClassificationModule(ConvNet(1, 5, WIDTHS, dropout=0.1), num_classes=5, optimizer=adamw(3e-3),
                                schedule=WarmupCosine(warmup_fraction=0.1), **arguments)
    batches = -(-len(train[0]) // batch_size)
    quiet_trainer(max_steps=steps, max_epochs=-(-steps // batches)).fit(task, loader(train, batch_size, True, seed))
    return accuracy(task, test)


def run(seeds: int, per_class: int, steps: int, batch_size: int, pretrain_epochs: int,
        names: list[str] | None = None) -> dict[str, Any]:
    """Every variant (or those in ``names``) on every seed (interleaved: seed by seed); the accuracies and the
    pretraining figures."""
    torch.set_num_threads(1)
    data = split_target(*digits_tensors())
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "pretrained_0_4.pt"
        started = time.perf_counter()
        source_acc = pretrain(data["source"], pretrain_epochs, weights)
        pretrain_seconds = time.perf_counter() - started
        batches = -(-5 * per_class // batch_size)
        epochs = -(-steps // batches)
        chosen = {k: v for k, v in variants(weights, epochs).items() if names is None or k in names}
        results: dict[str, list[float]] = {name: [] for name in chosen}
        for seed in range(seeds):
            train = draw_few(data["pool"], per_class, seed)
            for name, arguments in chosen.items():
                results[name].append(fine_tune(train, data["test"], seed, steps, batch_size, arguments))
    return {"accuracies": results, "source_accuracy": source_acc, "pretrain_seconds": pretrain_seconds,
            "test_images": len(data["test"][0]), "train_images": 5 * per_class, "epochs": epochs}


def table(result: dict[str, Any], seeds: int, steps: int) -> str:
    accuracies = result["accuracies"]
    scratch = statistics.mean(accuracies["scratch"])
    lines = [
        f"digits 5-9 from {result['train_images']} training images ({result['train_images'] // 5} per class), "
        f"{steps} optimizer steps ({result['epochs']} epochs), {seeds} seeds; test set {result['test_images']} images",
        f"pretrained network: ConvNet {WIDTHS} on digits 0-4, accuracy {result['source_accuracy']:.4f} there "
        f"({result['pretrain_seconds']:.0f} s)",
        "",
        "| variant | test acc per seed | mean | spread (max - min) | mean - scratch |",
        "|---|---|---|---|---|",
    ]
    for name, values in accuracies.items():
        mean = statistics.mean(values)
        per_seed = " ".join(f"{v:.3f}" for v in values)
        lines.append(f"| {name} | {per_seed} | **{mean:.4f}** | {max(values) - min(values):.3f} | "
                     f"{mean - scratch:+.4f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    network = argparse.ArgumentParser(add_help=False)
    network.add_argument("--network", choices=["convnet", "hf"], default="convnet")
    chosen, rest = network.parse_known_args(sys.argv[1:] if argv is None else argv)
    if chosen.network == "hf":
        import fine_tuning_hf

        return fine_tuning_hf.main(rest)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], parents=[network])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--per-class", type=int, default=10, help="training images per class (at most 20 here)")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of every variant")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--variants", nargs="+", default=None, help="a subset of the variants (default: all)")
    parser.add_argument("--pretrain-epochs", type=int, default=15)
    parser.add_argument("--no-write", action="store_true", help="do not write results/fine_tuning.txt")
    parser.add_argument("--quick", action="store_true",
                        help="2 seeds, 4 pretraining epochs, scratch and pretrained only (checks that it runs)")
    parser.add_argument("--json", type=Path, help="write the accuracies to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.pretrain_epochs, args.variants = 2, 4, args.variants or ["scratch", "pretrained"]
    result = run(args.seeds, args.per_class, args.steps, args.batch_size, args.pretrain_epochs, args.variants)
    text = table(result, args.seeds, args.steps)
    print(text)
    if not args.no_write:
        RESULTS.write_text(f"{_common.machine()}\n\n{text}\n")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
