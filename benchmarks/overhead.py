"""What the recipe's loop costs: the compute limit, the seeds' hand-written loop and the `recipes` path, side by side.

    python benchmarks/overhead.py                   # both models, 3 interleaved repetitions
    python benchmarks/overhead.py --quick           # a short smoke run (noisy numbers)
    python benchmarks/overhead.py --models spiral --repeats 5 --profile

Variants, each a fresh model from the same seed on the same data, optimizer (AdamW, two parameter groups), schedule
(linear warmup + cosine, stepped per optimizer step) and gradient clipping (norm 1.0):

  limit    a plain loop over batches sliced once before training, with torch's fused AdamW (the compute limit)
  seeds    the seeds' loop as the articles write it complete: DataLoader(TensorDataset, shuffle=True), zero_grad,
           forward, loss, backward, clip, step; after each epoch model.eval(), the validation split under no_grad,
           model.train(), and torch.save of the weights when the validation loss improved (not timed, like the
           recipe's validation and checkpoints, whose after-effects on the next epoch's batches both then carry)
  seedstrain the same training loop without the validation and the save (the seeds variant before stop 44)
  bare     bare Lightning: a minimal LightningModule with the same MLP, optimizer groups, per-step schedule and
           ``gradient_clip_val=1.0`` on the same data module's loader; ``logger=False``, no checkpointing, progress
           bar, model summary, validation or callbacks (only the timer), and torch's default AdamW as a user writes
           it. recipe / bare is the headline: what a run of the recipe costs per step against bare Lightning
  barefused bare Lightning with the optimizer kernel the recipe picks (``fused_where_supported``: torch's fused
           AdamW, on the CPU too): recipe / barefused is what loopwise's own code adds per step, like for like
  barecomplete barefused that also does what the seeds' complete loop does between epochs, Lightning's way: a
           ``validation_step`` logging ``val/loss`` over the validation split after every epoch and Lightning's
           ``ModelCheckpoint`` keeping the best weights by it (``barecomplete / seeds`` is Lightning's own loop doing
           the seeds' work; ``recipe / barecomplete`` is what loopwise adds to that)
  recipe   ``recipes fit`` in this process (``recipes.cli.main``) with MLflow logging on, the plan, the loop doctor,
           checkpoints and validation, as a user runs it
  nodoctor the recipe with the loop doctor's per-step checks off (non_finite, grad_norm, data_wait, mode): what
           the doctor costs
  nomlflow the recipe with ``--trainer.logger false`` (no MLflow, no LR monitor): what tracking costs

The report ends with where the recipe's time per step goes beyond bare Lightning, in milliseconds: the doctor
(recipe - nodoctor), MLflow (recipe - nomlflow) and the rest (the task's own step, the recipe's callbacks and the
work of each logging step).

Models: the spiral MLP 2-128-128-3 (batch 64, the spiral recipe) and an MLP 784-512-512-10 on generated data
(``SyntheticDataModule``, batch 256). Only the training batches of epochs 2..N are timed (not start-up, validation or
checkpoints): samples per second, medians over interleaved repetitions (limit, seeds, recipe, nodoctor, limit, ...),
printed with ratios; then the same ratios over the fast epochs (the 90th percentile of every timed epoch's samples per
second: a noisy machine slows epochs at random and never speeds one up, so the fast ones show the loops' own costs;
with ``--clock thread --threads 1`` the least noisy figure this machine gives), and the median of each repetition's
own recipe / base ratio (the variants of one repetition run within seconds of each other, so a slow phase of a shared
machine that lasts minutes slows both sides of the ratio). Targets: recipe >= 0.90x bare Lightning on the spiral and
>= 0.97x on the 784 MLP (the headline: what loopwise adds per step; the same against ``barecomplete``); recipe >= 0.8x
the limit on the spiral and >= 0.95x on the 784 MLP; recipe >= 1.0x the seeds' loop on both (``seedstrain`` is printed
against the same target for comparison with earlier runs). ``--profile`` adds a cProfile of one recipe run's training
steps.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from _common import (REPO, LoopTimer, clock, epoch_rates, in_directory, machine, median, quantile, quiet,
                     recipe_thread_args, set_clock, set_threads, synchronize, throughput)

TARGETS = {"spiral": {"bare": 0.90, "barefused": 0.90, "barecomplete": 0.90, "limit": 0.8, "seeds": 1.0,
                      "seedstrain": 1.0},
           "mlp784": {"bare": 0.97, "barefused": 0.97, "barecomplete": 0.97, "limit": 0.95, "seeds": 1.0,
                      "seedstrain": 1.0}}


@dataclass
class Workload:
    """A model + data + optimizer setting, described once for the three loops."""

    name: str
    config: str  # YAML of the recipe
    in_features: int
    hidden: list[int]
    classes: int
    batch_size: int
    lr: float
    weight_decay: float
    warmup_fraction: float
    min_lr_ratio: float
    make_data: Callable[[], Any]  # -> a data module (set up by the loops)


def spiral_data() -> Any:
    from datamodules import SpiralDataModule

    return SpiralDataModule(n_samples=2000, n_classes=3, noise=0.2, batch_size=64, val_fraction=0.2,
                            test_fraction=0.1, seed=0)


def synthetic_data(n_samples: int) -> Callable[[], Any]:
    def make() -> Any:
        from datamodules import SyntheticDataModule

        return SyntheticDataModule(n_samples=n_samples, in_features=784, n_classes=10, batch_size=256,
                                   val_fraction=0.1, seed=0)

    return make


MLP784_YAML = """\
seed_everything: 0
trainer:
  max_epochs: 5
  gradient_clip_val: 1.0
  log_every_n_steps: 10
  deterministic: true
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    num_classes: 10
    model:
      class_path: lightning_modules.models.MLP
      init_args: {in_features: 784, out_features: 10, hidden_sizes: [512, 512]}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {lr: 0.001, weight_decay: 0.01}
    schedule:
      class_path: lightning_modules.optim.WarmupCosine
      init_args: {warmup_fraction: 0.05, min_lr_ratio: 0.01}
data:
  class_path: datamodules.SyntheticDataModule
  init_args: {n_samples: N_SAMPLES, in_features: 784, n_classes: 10, batch_size: 256, val_fraction: 0.1, seed: 0}
"""


def workloads(quick: bool) -> dict[str, Workload]:
    n = 2_000 if quick else 10_000
    return {
        "spiral": Workload("spiral", str(REPO / "configs" / "spiral_mlp.yaml"), 2, [128, 128], 3, 64, 0.01, 0.01,
                           0.05, 0.01, spiral_data),
        "mlp784": Workload("mlp784", MLP784_YAML.replace("N_SAMPLES", str(n)), 784, [512, 512], 10, 256, 1e-3,
                           0.01, 0.05, 0.01, synthetic_data(n)),
    }


# --- the two hand-written loops ------------------------------------------------------------------------------
def build(work: Workload, steps_per_epoch: int, epochs: int, fused: bool = False) -> tuple[Any, Any, Any]:
    """(model, optimizer, scheduler) as the recipe builds them: same init seed, groups, schedule formula; the
    optimizer with torch's default kernel, or with the one the recipe picks (``fused``)."""
    import torch

    from lightning_modules.models import MLP
    from lightning_modules.optim.optimizer_kernels import fused_where_supported
    from lightning_modules.optim.parameter_groups import param_groups
    from lightning_modules.optim.schedules import WarmupCosine

    torch.manual_seed(0)
    model = MLP(work.in_features, work.classes, work.hidden)
    optimizer = torch.optim.AdamW(param_groups(model), lr=work.lr, weight_decay=work.weight_decay)
    if fused:
        optimizer = fused_where_supported(optimizer)
    schedule = WarmupCosine(warmup_fraction=work.warmup_fraction, min_lr_ratio=work.min_lr_ratio)
    scheduler = schedule.build(optimizer, steps_per_epoch * epochs, "val/loss", "min")["scheduler"]
    return model, optimizer, scheduler


def split_tensors(work: Workload, *splits: str) -> list[tuple[Any, Any]]:
    """The (inputs, targets) tensors of each named split ("train", "val") of the workload's data module."""
    dm = work.make_data()
    dm.setup("fit")
    return [dm.datasets[split].tensors for split in splits]


def run_limit(work: Workload, epochs: int) -> list[tuple[int, float, int, int]]:
    """The compute limit: batches sliced once up front (one fixed order), then the six operations per step."""
    import torch
    import torch.nn.functional as F

    [(x, y)] = split_tensors(work, "train")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    batches = [(x[order[i:i + work.batch_size]], y[order[i:i + work.batch_size]])
               for i in range(0, len(x), work.batch_size)]
    model, optimizer, scheduler = build(work, len(batches), epochs, fused=True)
    model.train()
    out = []
    for epoch in range(epochs):
        synchronize()
        start = clock()
        for xb, yb in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
        synchronize()
        out.append((epoch, clock() - start, len(x), len(batches)))
    return out


def run_seeds(work: Workload, epochs: int, after_epoch: Callable[[int], None] | None = None,
              validate: bool = True) -> list[tuple[int, float, int, int]]:
    """The seeds' loop: a shuffling DataLoader over a TensorDataset (per-sample __getitem__ + collate); with
    ``validate`` (the articles' complete loop) after every epoch ``model.eval()``, the validation split under
    ``torch.no_grad()``, ``model.train()``, and ``torch.save`` of the weights when the validation loss improved
    (not timed, like the recipe's validation and checkpoints; their effect on the next epoch's batches is)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, TensorDataset

    (x, y), (x_val, y_val) = split_tensors(work, "train", "val")
    loader = DataLoader(TensorDataset(x, y), batch_size=work.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    model, optimizer, scheduler = build(work, len(loader), epochs)
    model.train()
    out = []
    best_val_loss = float("inf")
    with tempfile.TemporaryDirectory() as folder:
        for epoch in range(epochs):
            synchronize()
            start = clock()
            for xb, yb in loader:
                optimizer.zero_grad()
                outputs = model(xb)
                loss = F.cross_entropy(outputs, yb)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                optimizer.step()
                scheduler.step()
            synchronize()
            out.append((epoch, clock() - start, len(x), len(loader)))
            if validate:
                model.eval()
                with torch.no_grad():
                    val_loss = F.cross_entropy(model(x_val), y_val).item()
                model.train()
                if val_loss < best_val_loss:
                    best_val_loss = val_loss
                    torch.save(model.state_dict(), Path(folder) / "best_model.pt")
            if after_epoch is not None:
                after_epoch(epoch)
    return out


def run_bare(work: Workload, epochs: int, fused: bool = False,
             complete: bool = False) -> list[tuple[int, float, int, int]]:
    """Bare Lightning on the recipe's loader: the least a LightningModule does for the same training (with torch's
    default optimizer kernel, or the recipe's: ``fused``); with ``complete`` (and the recipe's kernel) also what the
    seeds' complete loop does between epochs, done Lightning's way: a ``validation_step`` logging ``val/loss`` on
    the validation split after every epoch, and Lightning's ``ModelCheckpoint`` keeping the best weights by it."""
    import lightning.pytorch as pl
    import torch.nn.functional as F
    from lightning.pytorch.callbacks import ModelCheckpoint

    from _common import LoopTimer

    dm = work.make_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    val_loader = dm.val_dataloader() if complete else None
    model, optimizer, scheduler = build(work, len(loader), epochs, fused=fused)

    class Bare(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            inputs, targets = batch
            return F.cross_entropy(self.model(inputs), targets)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            inputs, targets = batch
            self.log("val/loss", F.cross_entropy(self.model(inputs), targets), batch_size=len(targets))

        def configure_optimizers(self) -> Any:
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    LoopTimer.reset()
    with tempfile.TemporaryDirectory() as folder, quiet():
        best = ModelCheckpoint(dirpath=folder, monitor="val/loss", save_top_k=1, save_weights_only=True)
        trainer = pl.Trainer(
            max_epochs=epochs, gradient_clip_val=1.0, logger=False, enable_checkpointing=complete,
            enable_progress_bar=False, enable_model_summary=False, limit_val_batches=None if complete else 0,
            num_sanity_val_steps=0, callbacks=[LoopTimer(), *([best] if complete else [])], deterministic=True,
            accelerator="cpu" if not _cuda() else "auto", default_root_dir=folder,
        )
        trainer.fit(Bare(), train_dataloaders=loader, val_dataloaders=val_loader)
    return list(LoopTimer.epochs)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# --- the recipe -------------------------------------------------------------------------------------------------
NO_DOCTOR = ["--loop_doctor.non_finite", "false", "--loop_doctor.grad_norm", "false",
             "--loop_doctor.data_wait", "false", "--loop_doctor.mode_check", "false"]


def run_recipe(work: Workload, epochs: int, workdir: Path, extra: list[str] | None = None,
               profile: cProfile.Profile | None = None) -> list[tuple[int, float, int, int]]:
    """``recipes fit`` in this process, in ``workdir`` (its own mlflow.db), timed by ``LoopTimer``."""
    from recipes.cli import main

    if "\n" in work.config:  # YAML text: written into the run's directory
        workdir.mkdir(parents=True, exist_ok=True)
        config = workdir / f"{work.name}.yaml"
        config.write_text(work.config)
    else:
        config = Path(work.config)
    args = ["fit", "-c", str(config), "--trainer.max_epochs", str(epochs),
            "--trainer.callbacks+=_common.LoopTimer", *recipe_thread_args(), *(extra or [])]
    LoopTimer.reset()
    with in_directory(workdir), quiet():
        if profile is not None:
            profile.enable()
        try:
            main(args)
        finally:
            if profile is not None:
                profile.disable()
    return list(LoopTimer.epochs)


@contextmanager
def fits_wrapped(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> Iterator[None]:
    """``lightning.pytorch.Trainer.fit`` replaced by ``wrap(fit)`` meanwhile: how the measuring scripts add a callback
    or a profiler to both loops' trainers (the tests add a callback to ``barecomplete`` this way)."""
    import lightning.pytorch as pl

    original_fit = pl.Trainer.fit
    pl.Trainer.fit = wrap(original_fit)  # type: ignore[method-assign]
    try:
        yield
    finally:
        pl.Trainer.fit = original_fit  # type: ignore[method-assign]


def run_like_for_like(loop: str, model: str, epochs: int, workdir: Path,
                      recipe_args: list[str] | None = None) -> list[tuple[int, float, int, int]]:
    """One fit of ``model``'s workload: bare Lightning with the recipe's optimizer kernel (``loop="bare"``:
    ``barefused``, like for like; ``"barecomplete"``: with validation and the best checkpoint as well) or
    ``recipes fit`` with 1 torch thread (``"recipe"``, then ``recipe_args``)."""
    work = workloads(False)[model]
    if loop in ("bare", "barecomplete"):
        return run_bare(work, epochs, fused=True, complete=loop == "barecomplete")
    return run_recipe(work, epochs, workdir, ["--torch_threads", "1", *(recipe_args or [])])


def measure(names: list[str], repeats: int, epochs: int, quick: bool, root: Path,
            variants: list[str]) -> tuple[dict[str, dict[str, list[float]]], dict[str, dict[str, list[float]]]]:
    """(samples/s of each run, samples/s of each timed epoch of all runs), by model and variant."""
    import torch

    works = workloads(quick)
    results: dict[str, dict[str, list[float]]] = {n: {v: [] for v in variants} for n in names}
    per_epoch: dict[str, dict[str, list[float]]] = {n: {v: [] for v in variants} for n in names}
    # both recipes set deterministic: true, which Lightning applies process-wide; every loop runs under it
    torch.use_deterministic_algorithms(True)
    if not quick:  # warm-up: imports, MLflow schema, kernels; sets the recipe's global flags for every loop
        for name in names:
            run_recipe(works[name], 2, root / f"warmup-{name}")
    for rep in range(repeats):
        for name in names:
            work = works[name]
            for variant in variants:
                if variant == "limit":
                    epochs_run = run_limit(work, epochs)
                elif variant in ("seeds", "seedstrain"):
                    epochs_run = run_seeds(work, epochs, validate=variant == "seeds")
                elif variant in ("bare", "barefused", "barecomplete"):
                    epochs_run = run_bare(work, epochs, fused=variant != "bare", complete=variant == "barecomplete")
                else:
                    extra = {"nodoctor": NO_DOCTOR, "nomlflow": ["--trainer.logger", "false"]}.get(variant)
                    epochs_run = run_recipe(work, epochs, root / f"{name}-{variant}-{rep}", extra)
                rate, steps, seconds = throughput(epochs_run, skip=1)
                results[name][variant].append(rate)
                per_epoch[name][variant].extend(epoch_rates(epochs_run, skip=1))
                print(f"  rep {rep + 1}/{repeats} {name:>6} {variant:>8}: {rate:10.0f} samples/s "
                      f"({steps} steps in {seconds:.2f} s)", flush=True)
    return results, per_epoch


def report(results: dict[str, dict[str, list[float]]],
           per_epoch: dict[str, dict[str, list[float]]] | None = None) -> list[dict[str, Any]]:
    rows = []
    print()
    print(f"{'model':>6}  {'variant':>8}  {'samples/s (median)':>18}  runs")
    for name, by_variant in results.items():
        for variant, rates in by_variant.items():
            runs = ", ".join(f"{r:.0f}" for r in rates)
            print(f"{name:>6}  {variant:>8}  {median(rates):18.0f}  {runs}")
    print()
    for name, by_variant in results.items():
        recipe = median(by_variant.get("recipe", []))
        for base in ("bare", "barefused", "barecomplete", "limit", "seeds", "seedstrain"):
            if base not in by_variant or "recipe" not in by_variant:
                continue
            ratio = recipe / median(by_variant[base])
            target = TARGETS[name][base]
            verdict = "meets" if ratio >= target else "MISSES"
            print(f"{name}: recipe / {base} = {ratio:.3f} ({verdict} the >= {target} target)")
            rows.append({"model": name, "ratio": f"recipe / {base}", "value": ratio, "target": target,
                         "met": ratio >= target})
            paired = median([r / b for r, b in zip(by_variant["recipe"], by_variant[base])])
            print(f"{name}: recipe / {base} paired by repetition (median of the {len(by_variant[base])} "
                  f"repetitions' own ratios: both ran within seconds of each other) = {paired:.3f}")
            rows.append({"model": name, "ratio": f"recipe / {base} (paired)", "value": paired, "target": target,
                         "met": paired >= target})
            if per_epoch and per_epoch[name].get(base) and per_epoch[name].get("recipe"):
                fast = quantile(per_epoch[name]["recipe"], 0.9) / quantile(per_epoch[name][base], 0.9)
                print(f"{name}: recipe / {base} over the fast epochs (90th percentile of per-epoch samples/s, "
                      f"{len(per_epoch[name]['recipe'])} epochs each) = {fast:.3f}")
                rows.append({"model": name, "ratio": f"recipe / {base} (fast epochs)", "value": fast,
                             "target": target, "met": fast >= target})
        for lightning in ("bare", "barefused", "barecomplete"):
            if lightning in by_variant and "seeds" in by_variant:
                # what Lightning's own loop reaches against the seeds' hand-written one, with nothing of loopwise in
                # it: the recipe / seeds target lies above this wherever it is below 1
                ceiling = median([b / s for b, s in zip(by_variant[lightning], by_variant["seeds"])])
                print(f"{name}: {lightning} Lightning alone / seeds paired = {ceiling:.3f} (Lightning's own loop, "
                      f"no loopwise code, against the seeds' loop)")
                rows.append({"model": name, "ratio": f"{lightning} / seeds (paired)", "value": ceiling,
                             "target": None, "met": None})
        breakdown = step_breakdown(name, by_variant)
        if breakdown:
            print(f"{name}: per step {breakdown['text']}")
            rows.append({"model": name, "ratio": "ms per step", "value": breakdown["extra_ms"], "target": None,
                         "met": None, "detail": breakdown["text"]})
        for other, what in (("nodoctor", "without the doctor's per-step checks"), ("nomlflow", "without MLflow")):
            if other in by_variant and "recipe" in by_variant:
                ratio = recipe / median(by_variant[other])
                print(f"{name}: recipe / recipe {what} = {ratio:.3f}")
                rows.append({"model": name, "ratio": f"recipe / {other}", "value": ratio, "target": None,
                             "met": None})
    return rows


def step_breakdown(name: str, by_variant: dict[str, list[float]]) -> dict[str, Any] | None:
    """Where the recipe's time per step goes beyond bare Lightning (with the recipe's optimizer kernel where the
    ``barefused`` variant ran), from the medians (milliseconds per step): the
    loop doctor's per-step checks (recipe - nodoctor), MLflow tracking (recipe - nomlflow) and the rest (the task's
    own step, the recipe's callbacks, logging every ``log_every_n_steps``)."""
    base = "barefused" if by_variant.get("barefused") else "bare"  # like for like where measured
    if not by_variant.get(base) or not by_variant.get("recipe"):
        return None
    batch = workloads(False)[name].batch_size
    ms = {v: 1000.0 * batch / median(rates) for v, rates in by_variant.items() if rates}
    extra = ms["recipe"] - ms[base]
    parts = [f"{base} {ms[base]:.3f} ms, recipe {ms['recipe']:.3f} ms ({extra:+.3f})"]
    rest = extra
    for other, what in (("nodoctor", "doctor"), ("nomlflow", "MLflow")):
        if other in ms:
            cost = ms["recipe"] - ms[other]
            rest -= cost
            parts.append(f"{what} {cost:+.3f}")
    parts.append(f"task, callbacks and logging steps {rest:+.3f}")
    return {"extra_ms": extra, "text": ": ".join(parts[:1]) + " = " + ", ".join(parts[1:])}


def profile_recipe(name: str, epochs: int, quick: bool, root: Path, top: int) -> str:
    """cProfile of one recipe run; the functions with the most cumulative time inside the training batches."""
    profiler = cProfile.Profile()
    run_recipe(workloads(quick)[name], epochs, root / f"profile-{name}", profile=profiler)
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats("run_training_batch|advance|_call_callback_hooks|optimizer_step|"
                                               "training_step|log|backward|on_train_batch|on_before|on_after|"
                                               "clip|item|isfinite|get_total_norm|modules_in_train_mode|__next__|"
                                               "update|_shared_step|forward", top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=["spiral", "mlp784"], default=["spiral", "mlp784"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (the first is not timed)")
    parser.add_argument("--variants", nargs="+",
                        choices=["limit", "seeds", "seedstrain", "bare", "barefused", "barecomplete", "recipe",
                                 "nodoctor", "nomlflow"],
                        default=["limit", "seeds", "bare", "barefused", "recipe", "nodoctor", "nomlflow"])
    parser.add_argument("--quick", action="store_true", help="1 repetition, 3 epochs, 2,000 samples for the MLP")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of one recipe run per model")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--clock", choices=["wall", "cpu", "thread"], default="wall",
                        help="wall time (default); this process's CPU time for a busy shared machine (with "
                             "--threads 1; blind to waiting for disk, so it undercounts MLflow's writes); or the "
                             "training thread's CPU time (with --threads 1: the loop's own work, without MLflow's "
                             "background writer, which logging_overhead.py measures)")
    parser.add_argument("--json", type=Path, help="write the ratios to this JSON file")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    set_clock(args.clock)
    repeats = 1 if args.quick else args.repeats
    epochs = args.epochs or (3 if args.quick else 6)
    variants = args.variants
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    print(f"overhead: {machine()}, {args.clock} clock")
    print(f"  {repeats} repetition(s) x {epochs} epochs (epochs 2..{epochs} timed), variants {', '.join(variants)}")
    with tempfile.TemporaryDirectory() as tmp:
        results, per_epoch = measure(args.models, repeats, epochs, args.quick, Path(tmp), variants)
        rows = report(results, per_epoch)
        if args.profile:
            for name in args.models:
                print(f"\n--- cProfile of the {name} recipe ({epochs} epochs, cumulative seconds) ---")
                print(profile_recipe(name, epochs, args.quick, Path(tmp), 40))
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "overhead", "rows": rows,
                                         "samples_per_s": {n: {v: median(r) for v, r in by.items()}
                                                           for n, by in results.items()}}, indent=2))


if __name__ == "__main__":
    sys.exit(main())
