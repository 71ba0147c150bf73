"""Run every recipe end to end and measure it beside peer baselines on the same split.

    python benchmarks/recipes_table.py                 # all recipes, prints a markdown table
    python benchmarks/recipes_table.py --write-readme  # also replaces the table in README.md
    python benchmarks/recipes_table.py spiral_mlp digits_convnet
    python benchmarks/recipes_table.py --check-reproducible digits_convnet   # twice; fails if a metric differs
    python benchmarks/recipes_table.py --quick spiral_mlp   # 2 epochs: checks that it runs (run_all --quick)

Each recipe runs as a user would run it: ``recipes fit -c configs/<recipe>.yaml`` then ``recipes test|validate
--ckpt_path best`` in a fresh temporary directory (its own mlflow.db), and its metric is read back from MLflow.
torch's intra-op threads are pinned for those commands (``--threads``, default 2, the recipes' own
``torch_threads``, passed as ``--torch_threads``; 0 passes ``null``: torch's default): CPU kernels that sum over a dimension (the weight gradients of a convolution or a Linear
layer) split the sum across threads, so the rounding, and after a few hundred steps the trained weights and the
test metrics, depend on the thread count. With ``--check-reproducible`` (on for ``--write-readme``) every recipe
runs twice, each time in a fresh directory, and any metric that differs between the two runs is printed with both
values and fails the script (exit status 1; README.md is then not written).
Baselines are fitted on exactly the recipe's train split and scored on its test split, taken from the recipe's
own data module: scikit-learn's SVC and LogisticRegression (digits), HistGradientBoosting (tabular, regression),
Ridge (regression), bag-of-tokens logistic regression (text), the unigram entropy (character LM).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import date
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
START, END = "<!-- recipes-table:start -->", "<!-- recipes-table:end -->"


DEFAULT_THREADS = 2


def recipe_environment() -> dict[str, str]:
    """This process's environment for a recipe's commands, without a tracking URI (each run gets its own
    mlflow.db)."""
    return {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}


def thread_arguments(threads: int) -> list[str]:
    """The recipe option that pins torch's intra-op threads (0: left to torch, one per physical core)."""
    return ["--torch_threads", str(threads) if threads > 0 else "null"]


def run_recipe(name: str, evaluate: str, threads: int = DEFAULT_THREADS,
               *fit_args: str) -> tuple[dict[str, float], float]:
    """Fit a recipe (with ``fit_args`` added to its command line) and evaluate its best checkpoint in a fresh
    directory; returns (metrics of the evaluation run, with ``epochs`` the fit's number of epochs, and fit seconds)."""
    from mlflow.tracking import MlflowClient

    config = REPO / "configs" / f"{name}.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "data").symlink_to(REPO / "data")
        env = recipe_environment()
        pin = thread_arguments(threads)
        start = time.perf_counter()
        subprocess.run(["recipes", "fit", "-c", str(config), *pin, *fit_args], cwd=tmp, env=env, check=True,
                       capture_output=True)
        fit_seconds = time.perf_counter() - start
        subprocess.run(["recipes", evaluate, "-c", str(config), "--ckpt_path", "best", *pin], cwd=tmp, env=env, check=True,
                       capture_output=True)
        client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
        exp = client.get_experiment_by_name(name)
        runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time DESC"])
        evaluation = next(r for r in runs if r.data.tags.get("loopwise.stage") == evaluate)
        fit = next(r for r in runs if r.data.tags.get("loopwise.stage") == "fit")
        metrics = dict(evaluation.data.metrics)
        metrics["epochs"] = float(len(client.get_metric_history(fit.info.run_id, "val/loss")))  # one per epoch
        return metrics, fit_seconds


def differing_metrics(first: dict[str, float], second: dict[str, float]) -> list[str]:
    """One line per metric that is not bit-for-bit the same in two runs (or is missing from one), with both
    values; empty when the runs agree."""
    lines = []
    for key in sorted(set(first) | set(second)):
        a, b = first.get(key), second.get(key)
        if a is None or b is None or not (a == b or (math.isnan(a) and math.isnan(b))):
            lines.append(f"{key}: first run {a!r}, second run {b!r}")
    return lines


def split_arrays(datamodule: Any) -> tuple[Any, Any, Any, Any]:
    """(x_train, y_train, x_test, y_test) as NumPy arrays from an in-memory data module after setup."""
    datamodule.setup("fit")
    x_train, y_train = datamodule.datasets["train"].tensors
    x_test, y_test = datamodule.datasets["test"].tensors
    return x_train.flatten(1).numpy(), y_train.numpy(), x_test.flatten(1).numpy(), y_test.numpy()


def data_module(name: str) -> Any:
    """The recipe's data module exactly as its YAML configures it."""
    import yaml

    import datamodules

    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())["data"]
    cls = getattr(datamodules, config["class_path"].rsplit(".", 1)[-1])
    kwargs = dict(config.get("init_args", {}))
    if "path" in kwargs:
        kwargs["path"] = str(REPO / kwargs["path"])
    return cls(**kwargs)


def baselines_digits() -> str:
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    x_train, y_train, x_test, y_test = split_arrays(data_module("digits_convnet"))
    svc = (SVC().fit(x_train, y_train).predict(x_test) == y_test).mean()
    logreg = (LogisticRegression(max_iter=5000).fit(x_train, y_train).predict(x_test) == y_test).mean()
    return f"SVC {svc:.4f}, LogisticRegression {logreg:.4f}"


def baselines_tabular() -> str:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import f1_score, roc_auc_score

    x_train, y_train, x_test, y_test = split_arrays(data_module("tabular_mlp"))
    model = HistGradientBoostingClassifier(random_state=0).fit(x_train, y_train)
    auroc = roc_auc_score(y_test, model.predict_proba(x_test)[:, 1])
    f1 = f1_score(y_test, model.predict(x_test), average="macro")
    majority = max((y_test == c).mean() for c in set(y_test.tolist()))
    return f"HistGradientBoosting AUROC {auroc:.4f}, macro F1 {f1:.4f}; majority-class acc {majority:.4f}"


def baselines_regression() -> str:
    from sklearn.ensemble import HistGradientBoostingRegressor
    from sklearn.linear_model import RidgeCV
    from sklearn.metrics import mean_squared_error

    x_train, y_train, x_test, y_test = split_arrays(data_module("regression_mlp"))
    parts = []
    for label, model in (("Ridge", RidgeCV(alphas=[0.01, 0.1, 1, 10, 100])),
                         ("HistGradientBoosting", HistGradientBoostingRegressor(random_state=0))):
        rmse = mean_squared_error(y_test, model.fit(x_train, y_train).predict(x_test)) ** 0.5
        parts.append(f"{label} RMSE {rmse:.2f}")
    return ", ".join(parts)


def baselines_text() -> str:
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    dm = data_module("text_transformer")
    dm.setup("fit")

    def bag(split: str) -> tuple[Any, Any]:
        dataset = dm.datasets[split]
        rows = np.zeros((len(dataset), dm.vocab_size), dtype=np.float32)
        labels = np.zeros(len(dataset), dtype=np.int64)
        for i in range(len(dataset)):
            sample = dataset[i]
            np.add.at(rows[i], sample["input_ids"].numpy(), 1.0)
            labels[i] = int(sample["labels"])
        return rows, labels

    x_train, y_train = bag("train")
    x_test, y_test = bag("test")
    acc = (LogisticRegression(max_iter=3000).fit(x_train, y_train).predict(x_test) == y_test).mean()
    majority = max((y_test == c).mean() for c in set(y_test.tolist()))
    return f"bag-of-words LogisticRegression {acc:.4f}; majority-class {majority:.4f}"


def baselines_charlm() -> str:
    dm = data_module("charlm_gpt")
    text = dm.read_text() if hasattr(dm, "read_text") else (REPO / "data" / "tiny_corpus.txt").read_text()
    counts = Counter(text)
    total = sum(counts.values())
    entropy = -sum(c / total * math.log(c / total) for c in counts.values())
    return f"unigram entropy {entropy:.3f} nats (ppl {math.exp(entropy):.1f})"


RECIPES: dict[str, tuple[str, Callable[[dict[str, float]], str], Callable[[], str] | None]] = {
    "spiral_mlp": ("test", lambda m: f"test acc {m['test/acc']:.4f}", None),
    "digits_convnet": ("test", lambda m: f"test acc {m['test/acc']:.4f}", baselines_digits),
    "tabular_mlp": ("test", lambda m: f"test AUROC {m['test/auroc']:.4f}, macro F1 {m['test/f1']:.4f}, "
                                      f"acc {m['test/acc']:.4f}", baselines_tabular),
    "text_transformer": ("test", lambda m: f"test acc {m['test/acc']:.4f}", baselines_text),
    "charlm_gpt": ("validate", lambda m: f"val loss {m['val/loss']:.3f} nats (ppl {m['val/ppl']:.2f})",
                   baselines_charlm),
    "regression_mlp": ("test", lambda m: f"test RMSE {m['test/rmse']:.2f}, R2 {m['test/r2']:.3f}",
                       baselines_regression),
}


def cpu_name() -> str:
    """The processor's model name (its kernels' rounding can differ from another processor's), or the machine."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipes", nargs="*", default=list(RECIPES), help="recipe names (default: all)")
    parser.add_argument("--write-readme", action="store_true", help="replace the recipe table in README.md")
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS, metavar="N",
                        help=f"torch intra-op threads of the recipe runs (default {DEFAULT_THREADS}; 0: torch's "
                             "default, one per physical core, which makes the numbers depend on the machine)")
    parser.add_argument("--check-reproducible", action=argparse.BooleanOptionalAction, default=None,
                        help="run every recipe twice, each in a fresh directory, and fail when a metric differs "
                             "(default: on with --write-readme, off otherwise)")
    parser.add_argument("--json", type=Path, help="write the table's rows and the failures to this JSON file")
    parser.add_argument("--quick", action="store_true",
                        help="2 epochs per fit: checks that the recipes run (the metrics mean nothing here)")
    args = parser.parse_args(argv)
    if args.quick and args.write_readme:
        parser.error("--quick fits 2 epochs: its metrics do not belong in README.md (drop --quick or --write-readme)")
    fit_args = ["--trainer.max_epochs", "2"] if args.quick else []
    check = args.write_readme if args.check_reproducible is None else args.check_reproducible
    unknown = [name for name in args.recipes if name not in RECIPES]
    if unknown:
        parser.error(f"unknown recipe(s) {unknown}; choose from {list(RECIPES)}")
    rows, failures = [], []
    for name in args.recipes:
        if not (REPO / "configs" / f"{name}.yaml").is_file():
            print(f"skip {name}: configs/{name}.yaml does not exist", file=sys.stderr)
            continue
        evaluate, describe, baseline = RECIPES[name]
        metrics, seconds = run_recipe(name, evaluate, args.threads, *fit_args)
        if check:
            again, seconds_again = run_recipe(name, evaluate, args.threads, *fit_args)
            differences = differing_metrics(metrics, again)
            for line in differences:
                print(f"NOT REPRODUCIBLE {name}: {line}", file=sys.stderr, flush=True)
            if differences:
                failures.append(name)
            else:
                print(f"{name}: two runs in fresh directories gave the same {len(metrics)} metrics", flush=True)
            seconds = min(seconds, seconds_again)
        peer = baseline() if baseline is not None else "-"
        rows.append(f"| `configs/{name}.yaml` | {describe(metrics)} | {peer} | {int(metrics['epochs'])} | "
                    f"{seconds:.0f} s |")
        print(rows[-1], flush=True)
    import sklearn
    import torch

    threads = f"torch threads pinned to {args.threads}" if args.threads > 0 else "torch threads default"
    checked = ", every recipe run twice with identical metrics" if check and not failures else ""
    header = [
        f"Measured {date.today().isoformat()} on {cpu_name()} ({platform.machine()}, {os.cpu_count()} CPU cores), "
        f"torch {torch.__version__}, {threads}{checked} (baselines: scikit-learn {sklearn.__version__}), by `python benchmarks/recipes_table.py"
        f"{'' if args.threads == DEFAULT_THREADS else f' --threads {args.threads}'}` "
        f"(fit wall time includes start-up{'; the faster of the two runs' if check else ''}).",
        "",
        "| recipe | result (best checkpoint) | peer baseline, same split | epochs | fit wall time |",
        "|---|---|---|---|---|",
    ]
    table = "\n".join(header + rows)
    print()
    print(table)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "failures": failures}, indent=2))
    if failures:
        sys.exit(f"not reproducible: {', '.join(failures)} (the differing metrics are above); README.md not written")
    if args.write_readme:
        text = README.read_text()
        if START not in text or END not in text:
            sys.exit(f"README.md lacks the {START} ... {END} markers")
        pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
        README.write_text(pattern.sub(lambda _: f"{START}\n{table}\n{END}", text))
        print(f"README.md updated ({len(rows)} recipes)")


if __name__ == "__main__":
    main()
