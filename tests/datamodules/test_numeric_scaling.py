"""The scalers of numeric columns (issue 55, item 2): the quantile map to a normal against scikit-learn's
QuantileTransformer, robust scaling with hand-computed numbers, NaN left out of every statistic, and the scaling kept
in the encoder's state."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.column_encoding import ColumnEncoder
from datamodules.numeric_scaling import QuantileScaler, RobustScaler, fit_standardizer


def column(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)[:, None]


@pytest.mark.parametrize("n", [300, 2500])  # fewer rows than 1,024 quantiles (one per row), and more
def test_the_quantile_map_is_scikit_learns_quantile_transformer_to_a_normal(n):
    from sklearn.preprocessing import QuantileTransformer

    rng = np.random.default_rng(0)
    train = np.stack([rng.lognormal(size=n), np.round(rng.normal(size=n), 1), rng.integers(0, 4, n)], axis=1)
    new = np.concatenate([train[:50], [[-10.0, -9.0, -1.0], [1e6, 9.0, 7.0]], rng.normal(size=(30, 3)) * 3])
    ours = QuantileScaler().fit(torch.from_numpy(train))
    theirs = QuantileTransformer(output_distribution="normal", n_quantiles=min(1024, n), subsample=None).fit(train)
    assert [len(q) for q in ours.quantiles] == [min(1024, n)] * 3
    for rows in (train, new):
        mine = ours.transform(torch.from_numpy(rows)).numpy()
        # equal but for the clipped ends (ndtri(1 - 1e-7) here, norm.ppf(1 - (1e-7 - 2.2e-16)) there: 4e-10 apart),
        # and for values equal to the train minimum or maximum: scikit-learn clamps them to level 0 or 1, here a
        # value many rows share takes the middle of its levels, as inside the range
        at_an_end = (rows == train.min(axis=0)) | (rows == train.max(axis=0))
        assert np.abs(mine - theirs.transform(rows))[~at_an_end].max() < 1e-8
    out = ours.transform(torch.from_numpy(train))
    inner = out[:, 0][out[:, 0].abs() < 5]  # the smallest and largest value sit at the clipped ends, +-5.2
    assert len(inner) == n - 2 and abs(inner.mean().item()) < 0.01 and abs(inner.std().item() - 1.0) < 0.05  # ~N(0, 1)
    assert out.abs().max().item() == pytest.approx(5.1993375, abs=1e-6)  # ndtri(1e-7) and ndtri(1 - 1e-7): the ends


def test_a_value_many_rows_share_at_the_train_minimum_takes_the_middle_of_its_levels_not_the_end():
    # a zero-inflated count: 3 of 5 train rows are 0 (scikit-learn's QuantileTransformer maps them to -5.2)
    scaler = QuantileScaler().fit(column([0.0, 0.0, 0.0, 1.0, 2.0]))
    out = scaler.transform(column([0.0, 1.0, 2.0, 5.0, -1.0])).flatten().tolist()
    assert out[0] == pytest.approx(-0.6744897, abs=1e-6)  # level 0.25, the middle of 0's levels [0, 0.5]
    assert out[1] == pytest.approx(0.6744897, abs=1e-6)  # level 0.75
    assert out[2] == out[3] == pytest.approx(5.1993375, abs=1e-6) and out[4] == pytest.approx(-5.1993375, abs=1e-6)


def test_a_constant_column_maps_to_zero_and_missing_values_are_left_out_of_the_quantiles():
    scaler = QuantileScaler().fit(torch.tensor([[2.0, 1.0], [2.0, float("nan")], [2.0, 3.0]], dtype=torch.float64))
    assert scaler.quantiles[1].tolist() == [1.0, 3.0]  # two observed values: two quantiles
    out = scaler.transform(torch.tensor([[2.0, 2.0], [5.0, 1.0]], dtype=torch.float64))
    assert out[:, 0].tolist() == [0.0, 0.0]  # scikit-learn would give -5.2 (its lower bound) here
    assert out[0, 1].item() == pytest.approx(0.0, abs=1e-12)  # the middle of [1, 3]
    assert out[1, 1].item() == pytest.approx(-5.199337582, abs=1e-8)  # ndtri(1e-7): the lowest level


def test_robust_scaling_by_hand():
    scaler = RobustScaler().fit(column([1.0, 2.0, 3.0, 4.0, 100.0, float("nan")]))  # NaN: not a value
    assert scaler.median.tolist() == [3.0] and scaler.scale.tolist() == [2.0]  # q75 4 - q25 2
    out = scaler.transform(column([1.0, 2.0, 3.0, 4.0, 100.0])).flatten().tolist()

    def smooth(z: float) -> float:
        return z / math.sqrt(1.0 + (z / 3.0) ** 2)

    assert out == pytest.approx([smooth(-1.0), smooth(-0.5), 0.0, smooth(0.5), smooth(48.5)], abs=1e-12)
    assert out[0] == pytest.approx(-0.9486832981, abs=1e-9) and out[4] == pytest.approx(2.9942772, abs=1e-6)


def test_robust_scaling_takes_half_the_range_when_the_quartiles_meet_and_1_for_a_constant_column():
    scaler = RobustScaler().fit(torch.tensor([[5.0, 7.0]] * 4 + [[9.0, 7.0]], dtype=torch.float64))
    assert scaler.median.tolist() == [5.0, 7.0] and scaler.scale.tolist() == [2.0, 1.0]  # (9 - 5) / 2; constant: 1
    out = scaler.transform(torch.tensor([[9.0, 8.0]], dtype=torch.float64))
    assert out[0].tolist() == pytest.approx([2.0 / math.sqrt(1 + 4 / 9), 1.0 / math.sqrt(1 + 1 / 9)], abs=1e-12)


def test_standardization_leaves_missing_values_out_and_is_unchanged_without_them():
    scaler = fit_standardizer(column([1.0, float("nan"), 3.0, 5.0]))
    assert scaler.mean.tolist() == [3.0] and scaler.std.tolist() == pytest.approx([math.sqrt(8.0 / 3.0)], abs=1e-15)
    full = torch.tensor([[1.0, 2.0], [4.0, 8.0], [0.5, 1.0]], dtype=torch.float64)
    from datamodules.preprocessing import Standardizer

    before = Standardizer().fit(full)
    assert torch.equal(fit_standardizer(full).mean, before.mean) and torch.equal(fit_standardizer(full).std, before.std)


@pytest.mark.parametrize("scaling", ["standard", "quantile", "robust"])
def test_the_scaling_is_part_of_the_saved_encoding(scaling):
    rng = np.random.default_rng(3)
    train = pd.DataFrame({"x": rng.exponential(size=200), "z": rng.normal(size=200), "y": ["a", "b"] * 100})
    train.loc[[3, 50], "x"] = np.nan
    fitted = ColumnEncoder("y", numeric_columns=["x", "z"], scaling=scaling).fit(train)
    state = json.loads(json.dumps(fitted.state_dict()))  # plain lists
    assert state["scaling"] == scaling and state["missing_indicators"] == ["x"]
    restored = ColumnEncoder("y")  # scaling "standard" by default: the saved one wins
    restored.load_state_dict(state)
    assert restored.scaling == scaling and restored.numeric_features == 2 and restored.in_features == 3
    rows = pd.DataFrame({"x": [0.1, np.nan, 40.0], "z": [0.0, 1.0, np.nan]})
    assert torch.equal(restored.transform(rows), fitted.transform(rows))
    assert (fitted.standardizer is not None) == (scaling == "standard")


def test_a_bad_scaling_or_missing_mode_is_one_line():
    with pytest.raises(ValueError, match=r"^Enc: scaling must be one of \['standard', 'quantile', 'robust'\], got 'minmax'$"):
        ColumnEncoder("y", owner="Enc", scaling="minmax")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^Enc: missing must be one of \['impute', 'error'\], got 'drop'$"):
        ColumnEncoder("y", owner="Enc", missing="drop")  # type: ignore[arg-type]
