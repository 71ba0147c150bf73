"""ColumnEncoder on its own: tiny pandas frames in, exact numbers out (no data module, no files)."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest
import torch

from datamodules.column_encoding import ColumnEncoder, category_name


def encoder(**kwargs) -> ColumnEncoder:
    return ColumnEncoder("y", numeric_columns=["x"], categorical_columns=["color"], **kwargs)


TRAIN = pd.DataFrame({"x": [1.0, 2.0, 3.0], "color": ["red", "blue", "red"], "y": ["b", "a", "b"]})


def test_one_hot_blocks_keep_slot_zero_for_unseen_and_missing_values_with_missing_error():
    enc = ColumnEncoder("y", categorical_columns=["color"], missing="error").fit(TRAIN)
    assert enc.vocabularies == {"color": ["blue", "red"]}  # sorted, from the fitted rows only
    assert enc.feature_names == ["color=<unknown>", "color=blue", "color=red"] and enc.in_features == 3
    rows = pd.DataFrame({"color": ["blue", "green", None, "red"]})
    expected = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    out = enc.transform(rows)
    assert out.dtype == torch.float32 and torch.equal(out, expected)


def test_numeric_columns_are_standardized_with_the_fitted_rows_statistics_only():
    enc = ColumnEncoder("y", numeric_columns=["x"]).fit(TRAIN)
    std = math.sqrt(2.0 / 3.0)  # population std of 1, 2, 3
    assert enc.standardizer.mean.tolist() == [2.0]
    assert enc.standardizer.std.tolist() == pytest.approx([std], abs=1e-15)
    out = enc.transform(pd.DataFrame({"x": [2.0, 5.0, -1.0]}))
    assert out[:, 0].tolist() == pytest.approx([0.0, 3.0 / std, -3.0 / std], abs=1e-6)
    enc.transform(pd.DataFrame({"x": [100.0, 200.0]}))  # encoding other rows learns nothing from them
    assert enc.standardizer.mean.tolist() == [2.0]


def test_a_row_is_the_numeric_columns_then_each_categorical_block():
    enc = encoder().fit(TRAIN)
    assert enc.feature_names == ["x", "color=<unknown>", "color=<missing>", "color=blue", "color=red"]
    assert enc.numeric_features == 1
    out = enc.transform(pd.DataFrame({"x": [3.0], "color": ["blue"]}))
    assert out[0].tolist() == pytest.approx([1.0 / math.sqrt(2.0 / 3.0), 0.0, 0.0, 1.0, 0.0], abs=1e-6)


def test_integral_numbers_are_named_without_a_decimal_point():
    assert [category_name(v) for v in (3.0, 2, True, 2.5, "a")] == ["3", "2", "True", "2.5", "a"]
    enc = ColumnEncoder("y", categorical_columns=["size"]).fit(pd.DataFrame({"size": [10.0, 2.0, None, 2.0]}))
    assert enc.feature_names == ["size=<unknown>", "size=<missing>", "size=10", "size=2"]  # sorted by their names


def test_state_round_trip_gives_identical_encodings():
    fitted = encoder().fit(TRAIN)
    state = fitted.state_dict()
    assert state == {
        "task": "classification",
        "target": "y",
        "class_names": None,
        "numeric_columns": ["x"],
        "categorical_columns": ["color"],
        "vocabularies": {"color": ["blue", "red"]},
        "numeric_mean": [2.0],
        "numeric_std": [pytest.approx(math.sqrt(2.0 / 3.0), abs=1e-15)],
        "missing": "impute",
        "numeric_fill": [2.0],
        "missing_indicators": [],
        "scaling": "standard",
        "numeric_scaler": {},
    }
    restored = ColumnEncoder("y")
    restored.load_state_dict(json.loads(json.dumps(copy.deepcopy(state))))  # plain lists: survives any serializer
    rows = pd.DataFrame({"x": [0.5, None, 7.25], "color": ["red", "purple", None]})
    assert torch.equal(restored.transform(rows), fitted.transform(rows))
    assert restored.state_dict() == state and restored.feature_names == fitted.feature_names


def test_class_ids_follow_the_sorted_labels_and_map_onto_restored_classes():
    enc = ColumnEncoder("y")
    assert enc.targets(pd.DataFrame({"y": [10, 2, 2, 10, 3]})).tolist() == [2, 0, 0, 2, 1]
    assert enc.class_names == ["2", "3", "10"]  # numbers sorted by value, not as strings
    assert enc.targets(pd.DataFrame({"y": [3, 10]})).tolist() == [1, 2]  # later tables map onto those classes
    with pytest.raises(ValueError, match=r"label '7' at row 1 of the table is not one of the checkpoint's classes"):
        enc.targets(pd.DataFrame({"y": [2, 7]}))


def test_regression_targets_are_float32_as_they_are():
    enc = ColumnEncoder("y", task="regression")
    out = enc.targets(pd.DataFrame({"y": [1.5, -2.0, 3.0]}))
    assert out.dtype == torch.float32 and out.tolist() == [1.5, -2.0, 3.0] and enc.class_names is None


def test_errors_name_the_column_row_and_value():
    enc = ColumnEncoder("y", numeric_columns=["x"], owner="Mine", source="'t.csv'")
    with pytest.raises(ValueError, match=r"^Mine: column 'x' of 't.csv' is treated as numeric but has the non-numeric "
                       r"value 'oops' at row 1 \(1 such row\(s\)\)"):
        enc.fit(pd.DataFrame({"x": ["1", "oops", "2"]}))
    strict = ColumnEncoder("y", numeric_columns=["x"], owner="Mine", source="'t.csv'", missing="error")
    with pytest.raises(ValueError, match=r"^Mine: numeric column 'x' of 't.csv' has a missing value \(NaN\) at row 2 "
                       r"\(1 missing row\(s\)\), and missing is 'error'; fill or drop those rows, or set missing: "
                       r"impute \(--data.init_args.missing impute\) to fill them with the train median$"):
        strict.fit(pd.DataFrame({"x": [1.0, 2.0, None]}))
    with pytest.raises(ValueError, match=r"^Mine: numeric column 'x' of 't.csv' has the value inf at row 1 \(1 "
                       r"infinite row\(s\)\); replace or drop those rows \(a numeric column takes finite numbers\)$"):
        enc.fit(pd.DataFrame({"x": [1.0, float("inf"), None]}))  # missing="impute" takes the None, never an inf
    with pytest.raises(RuntimeError, match="not fitted"):
        enc.transform(pd.DataFrame({"x": [1.0]}))


def test_identifier_like_columns_warn_through_the_given_callable():
    said: list[str] = []
    enc = ColumnEncoder("y", categorical_columns=["id"], warn=said.append)
    enc.fit(pd.DataFrame({"id": [f"u{i}" for i in range(60)]}))
    assert len(said) == 1 and "has 60 distinct values in 60 train rows; it looks like an identifier" in said[0]
    assert enc.in_features == 62  # 60 values, <unknown> and <missing>


def test_a_saved_encoding_of_another_target_is_refused():
    state = encoder().fit(TRAIN).state_dict()
    with pytest.raises(ValueError, match=r"the saved encoding has target='y' but this one has target='z'"):
        ColumnEncoder("z").load_state_dict(state)
