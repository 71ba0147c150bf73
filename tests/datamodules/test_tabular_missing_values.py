"""Missing values in tables (issue 55, item 1): numbers imputed with the train median plus indicators, missing
categories in a slot of their own, ``missing: error`` as before, saved encodings without the mode encoding as they
did; ``numeric_features``; ``batch_size: auto`` from the train rows."""

from __future__ import annotations

import copy
import functools
import math

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.column_encoding import ColumnEncoder
from datamodules.row_checks import bad_numbers, unknown_categories, unknown_categories_warning
from datamodules.tabular import TabularDataModule, auto_batch_size
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP

NEW_KEYS = ("missing", "numeric_fill", "missing_indicators", "scaling", "numeric_scaler")
STD = math.sqrt(8.0 / 3.0)  # population std of the observed 1, 3, 5


def train_frame() -> pd.DataFrame:
    return pd.DataFrame({"x": [1.0, np.nan, 3.0, 5.0], "z": [2.0, 2.0, 4.0, 4.0], "c": ["a", None, "b", "a"],
                         "y": ["p", "q", "p", "q"]})


def fitted(**kwargs) -> ColumnEncoder:
    frame = train_frame() if kwargs.get("missing") != "error" else train_frame().fillna({"x": 3.0})
    return ColumnEncoder("y", numeric_columns=["x", "z"], categorical_columns=["c"], **kwargs).fit(frame)


def test_a_missing_number_takes_the_train_median_and_its_column_gets_an_indicator():
    enc = fitted()
    assert enc.fill == [3.0, 3.0] and enc.indicators == ["x"]  # median of the observed 1, 3, 5; z has no NaN
    assert enc.standardizer.mean.tolist() == [3.0, 3.0]  # statistics of the observed values only
    assert enc.standardizer.std.tolist() == pytest.approx([STD, 1.0], abs=1e-15)
    assert enc.feature_names == ["x", "z", "x=<missing>", "c=<unknown>", "c=<missing>", "c=a", "c=b"]
    assert enc.numeric_features == 2 and enc.in_features == 7
    out = enc.transform(train_frame())
    assert out[:, 0].tolist() == pytest.approx([-2.0 / STD, 0.0, 0.0, 2.0 / STD], abs=1e-6)  # NaN -> 3 -> 0
    assert out[:, 1].tolist() == [-1.0, -1.0, 1.0, 1.0]
    assert out[:, 2].tolist() == [0.0, 1.0, 0.0, 0.0]  # the indicator
    assert out[:, 3:].tolist() == [[0, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]  # [a, NaN, b, a]


def test_a_missing_value_at_predict_time_in_a_column_without_any_in_train_is_imputed_without_an_indicator():
    enc = fitted()
    rows = pd.DataFrame({"x": [np.nan, 5.0], "z": [np.nan, 4.0], "c": ["zz", np.nan]})
    out = enc.transform(rows)
    assert out.shape == (2, 7)  # the width fitted on the train rows
    assert out[0, :3].tolist() == [0.0, 0.0, 1.0]  # x and z imputed with 3 (their mean): 0; x's indicator set
    assert out[1, :3].tolist() == pytest.approx([2.0 / STD, 1.0, 0.0], abs=1e-6)
    assert out[:, 3:].tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]  # unseen: <unknown>; missing: <missing>


def test_missing_error_keeps_the_encoding_before_missing_values_were_taken():
    enc = ColumnEncoder("y", numeric_columns=["z"], categorical_columns=["c"], missing="error").fit(train_frame())
    assert enc.feature_names == ["z", "c=<unknown>", "c=a", "c=b"] and enc.fill == [] and enc.indicators == []
    out = enc.transform(pd.DataFrame({"z": [3.0], "c": [None]}))
    assert out[0].tolist() == [0.0, 1.0, 0.0, 0.0]  # a missing category: the <unknown> slot
    with pytest.raises(ValueError, match=r"^ColumnEncoder: numeric column 'x' of the table has a missing value \(NaN\) "
                       r"at row 1 \(1 missing row\(s\)\), and missing is 'error'; fill or drop those rows, or set "
                       r"missing: impute \(--data.init_args.missing impute\) to fill them with the train median$"):
        ColumnEncoder("y", numeric_columns=["x"], missing="error").fit(train_frame())


def test_a_saved_encoding_without_the_mode_encodes_as_before():
    old = ColumnEncoder("y", numeric_columns=["z"], categorical_columns=["c"], missing="error").fit(train_frame())
    state = old.state_dict()
    legacy = {k: v for k, v in copy.deepcopy(state).items() if k not in NEW_KEYS}  # as written before this change
    assert set(state) - set(legacy) == set(NEW_KEYS)
    restored = ColumnEncoder("y")  # missing "impute" by default: the saved encoding decides
    restored.load_state_dict(legacy)
    assert restored.missing == "error" and restored.scaling == "standard"
    rows = pd.DataFrame({"z": [0.5, 4.0], "c": ["b", None]})
    assert torch.equal(restored.transform(rows), old.transform(rows))
    assert restored.feature_names == ["z", "c=<unknown>", "c=a", "c=b"]
    with pytest.raises(ValueError, match="missing is 'error'"):
        restored.transform(pd.DataFrame({"z": [np.nan], "c": ["a"]}))
    assert restored.state_dict() == state  # and it saves the mode it has


def test_the_request_checks_take_missing_numbers_when_the_encoder_imputes():
    rows = pd.DataFrame({"x": [np.nan, True, np.inf, "cheap"], "z": [None, 1.0, 2.0, 3.0],
                         "c": [None, "b", "new", "a"]}).astype(object)
    imputing, strict = fitted(), fitted(missing="error")
    assert bad_numbers(imputing, rows) == [
        (1, "x", "true is not a number"), (2, "x", "inf is not a finite number"), (3, "x", "'cheap' is not a number")
    ]
    assert [cell[:2] for cell in bad_numbers(strict, rows)] == [(0, "x"), (0, "z"), (1, "x"), (2, "x"), (3, "x")]
    assert "missing: error" in bad_numbers(strict, rows)[0][2]
    assert unknown_categories(imputing, rows) == ["", "", "c='new'", ""]  # a missing category is not unknown
    assert unknown_categories(strict, rows) == ["c=<missing>", "", "c='new'", ""]
    assert unknown_categories_warning("M", ["", "c='new'"], "'f.csv'") == (
        "M: 1 of 2 row(s) of 'f.csv' have a category the model was not trained on, predicted with the column's "
        "<unknown> slot (first: row 1, c='new'); the predictions name them in the column unknown_categories"
    )


def noisy_table(path, n: int = 400, seed: int = 0) -> str:
    """A CSV of ``n`` rows with missing values in a numeric and a categorical column (about 10% each)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"a": rng.normal(size=n), "b": rng.integers(0, 5, n), "count": rng.poisson(3.0, n),
                          "color": rng.choice(["red", "green", "blue"], n)})
    frame["label"] = np.where(frame["a"] + (frame["color"] == "red") > 0.5, "yes", "no")
    frame.loc[rng.random(n) < 0.1, "a"] = np.nan
    frame.loc[rng.random(n) < 0.1, "color"] = None
    frame.to_csv(path, index=False)
    return str(path)


def test_a_table_with_missing_values_trains_and_its_checkpoint_state_restores_the_imputation(tmp_path):
    path = noisy_table(tmp_path / "noisy.csv")
    assert pd.read_csv(path)["a"].dtype == np.float64  # numbers with empty fields: numeric
    dm = TabularDataModule(path, target="label", seed=1)
    dm.setup()
    assert dm.numeric_columns == ["a", "b", "count"] and dm.categorical_columns == ["color"]  # integers: numeric
    assert dm.numeric_features == 3 and dm.in_features == 3 + 1 + 5
    assert dm.feature_names[3:5] == ["a=<missing>", "color=<unknown>"]
    train = pd.read_csv(path).iloc[dm.split_rows["train"].numpy()]
    state = dm.state_dict()
    assert state["missing"] == "impute" and state["missing_indicators"] == ["a"]
    assert state["numeric_fill"][0] == pytest.approx(float(train["a"].median()), abs=1e-12)  # the train median
    x = dm.datasets["train"].tensors[0]
    assert torch.isfinite(x).all() and torch.equal(x[:, 3], torch.tensor(train["a"].isna().to_numpy(), dtype=torch.float32))
    restored = TabularDataModule(path, target="label", seed=5, missing="error")  # the checkpoint's mode wins
    restored.load_state_dict(copy.deepcopy(state))
    raw = pd.read_csv(path).drop(columns=["label"]).head(30)
    assert torch.equal(restored.frame_data(raw)[0].tensors[0], dm.frame_data(raw)[0].tensors[0])
    restored.check_rows(raw)  # missing numbers pass the request check
    module = ClassificationModule(MLP(dm.in_features, 2, [16]), num_classes=2,
                                  optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    assert math.isfinite(trainer.callback_metrics["val/loss"].item())


def test_quantile_scaling_through_the_data_module(tmp_path):
    path = noisy_table(tmp_path / "noisy.csv")
    dm = TabularDataModule(path, target="label", scaling="quantile")
    dm.setup()
    x = dm.datasets["train"].tensors[0][:, :3]
    assert dm.standardizer is None and dm.encoder.scaling == "quantile" and dm.hparams["scaling"] == "quantile"
    assert x[:, 0].abs().max().item() == pytest.approx(5.1993, abs=1e-3) and abs(x[:, 0].mean().item()) < 0.1


def test_a_numeric_column_with_no_value_in_the_train_split_is_one_line(tmp_path):
    frame = pd.DataFrame({"a": np.arange(20.0), "empty": [np.nan] * 20, "label": ["p", "q"] * 10})
    frame.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(ValueError, match=r"^TabularDataModule: numeric column 'empty' of '.*t\.csv' has no value in "
                       r"the 16 rows the encoding is fitted on \(the train split\): every one is missing; leave it "
                       r"out of features, or fill it$"):
        TabularDataModule(str(tmp_path / "t.csv"), target="label").setup()


@pytest.mark.parametrize(("rows", "size"), [(10, 16), (150, 16), (511, 16), (512, 32), (1_667, 64), (7_000, 256),
                                            (35_000, 512), (10**6, 512)])
def test_the_auto_batch_size_is_a_power_of_two_for_about_16_steps_an_epoch(rows, size):
    assert auto_batch_size(rows) == size


def test_batch_size_auto_is_chosen_in_setup_and_a_fit_uses_it(tmp_path):
    path = noisy_table(tmp_path / "noisy.csv", n=2_000)
    dm = TabularDataModule(path, target="label", batch_size="auto", val_fraction=0.2)
    assert dm.hparams["batch_size"] == "auto"
    dm.setup()
    assert dm.split_sizes["train"] == 1_600 and dm.batch_size == 64  # 1,600 / 16 = 100 -> 64
    assert dm.hparams["batch_size"] == "auto"  # the saved setting
    seen: list[int] = []

    class Sizes(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # type: ignore[no-untyped-def]
            seen.append(len(batch[0]))

    module = ClassificationModule(MLP(dm.in_features, 2, [8]), num_classes=2)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Sizes()])
    trainer.fit(module, datamodule=dm)
    assert seen == [64] * 25
    with pytest.raises(ValueError, match=r"^TabularDataModule: batch_size must be a whole number >= 1 or 'auto', got "
                       r"'big'$"):
        TabularDataModule(path, target="label", batch_size="big")  # type: ignore[arg-type]
    assert TabularDataModule(path, target="label", batch_size=32).batch_size == 32
