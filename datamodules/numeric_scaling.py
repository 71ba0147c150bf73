"""How a table's numeric columns are scaled: standardization, a quantile map to a normal, or robust scaling.

Each scaler is a plain class (no Lightning): ``fit`` learns per-column statistics from the observed values of the
rows it is given (the train split; a missing value, NaN, is left out of every statistic), ``transform`` scales
float64 values that hold no NaN (missing values are imputed first), and ``state_dict``/``load_state_dict`` carry the
statistics in plain lists. ``ColumnEncoder`` holds one of them (its ``scaling``).
"""

from __future__ import annotations

import math
from typing import Any, Literal, Union

import numpy as np
import torch
from torch import Tensor

from datamodules.preprocessing import Standardizer

#: The ways a numeric column can be scaled (``scaling`` of ``ColumnEncoder`` and ``TabularDataModule``).
ScalingKind = Literal["standard", "quantile", "robust"]
SCALINGS: tuple[str, ...] = ("standard", "quantile", "robust")
#: At most this many quantiles per column (scikit-learn's ``QuantileTransformer`` defaults to 1,000).
MAX_QUANTILES = 1024
#: Quantile levels are kept this far from 0 and 1, so the normal's inverse CDF stays finite (about +-5.2).
LEVEL_MARGIN = 1e-7
#: Robust scaling's smooth clipping: ``x / sqrt(1 + (x / SMOOTH_CLIP) ** 2)`` stays within +-SMOOTH_CLIP.
SMOOTH_CLIP = 3.0


def observed_columns(values: Tensor | np.ndarray) -> list[np.ndarray]:
    """Each column's values without its missing ones (NaN), as float64 arrays."""
    array = values.numpy() if isinstance(values, Tensor) else np.asarray(values)
    array = array.astype(np.float64, copy=False)
    return [column[~np.isnan(column)] for column in array.T]


def fit_standardizer(values: Tensor) -> Standardizer:
    """A ``Standardizer`` of mean and population std per column over the observed values (NaN left out).

    Without any NaN it is ``Standardizer().fit(values)`` as it is (the same numbers, to the bit, as before missing
    values were taken); otherwise each column is fitted on its observed values."""
    if not torch.isnan(values).any():
        return Standardizer().fit(values)
    fitted = [Standardizer().fit(torch.from_numpy(column)[:, None]) for column in observed_columns(values)]
    scaler = Standardizer()
    scaler.mean = torch.cat([s.mean for s in fitted]).to(values.dtype)  # type: ignore[misc]
    scaler.std = torch.cat([s.std for s in fitted]).to(values.dtype)  # type: ignore[misc]
    return scaler


class QuantileScaler:
    """Per column, a value's quantile level in the fitted values, mapped through the standard normal's inverse CDF:
    the fitted values come out about N(0, 1), whatever their distribution, and outliers land within about +-5.2.

    ``fit`` takes ``min(1024, n)`` quantiles of each column's ``n`` observed values at evenly spaced levels
    (``np.percentile``, made non-decreasing); ``transform`` finds a value's level by linear interpolation between
    them, averaging the upward and the downward interpolation where quantiles repeat (a value held by many rows
    gets the middle of its levels), takes level 0 below the first quantile and 1 above the last, keeps the level
    within [1e-7, 1 - 1e-7] and returns ``ndtri(level)``. This is scikit-learn's
    ``QuantileTransformer(output_distribution="normal", n_quantiles=1024, subsample=None)``, except that a constant
    column (one distinct value) is mapped to 0 (scikit-learn maps it to about -5.2).
    """

    def __init__(self) -> None:
        self.quantiles: list[np.ndarray] | None = None

    def fit(self, values: Tensor) -> "QuantileScaler":
        """Learn the quantiles of each column of ``values`` (float, samples along dimension 0; NaN: missing)."""
        quantiles = []
        for column in observed_columns(values):
            count = min(MAX_QUANTILES, len(column))
            # np.quantile at the levels as percentages, as scikit-learn takes them: on tied values the same side of
            # a jump (levels * 100 / 100 may round across it)
            found = np.percentile(column, np.linspace(0.0, 1.0, count) * 100) if count else np.zeros(0)
            quantiles.append(np.maximum.accumulate(found))  # rounding may step down
        self.quantiles = quantiles
        return self

    def transform(self, values: Tensor) -> Tensor:
        """Scale float64 ``values`` (no NaN) with the fitted quantiles: float64, same shape."""
        if self.quantiles is None:
            raise RuntimeError("QuantileScaler.transform called before fit")
        array = values.double().numpy()
        levels = np.empty_like(array)
        for j, quantiles in enumerate(self.quantiles):
            x = array[:, j]
            if len(quantiles) == 0 or quantiles[0] == quantiles[-1]:
                levels[:, j] = 0.5  # a constant column: the middle
                continue
            references = np.linspace(0.0, 1.0, len(quantiles))
            level = 0.5 * (np.interp(x, quantiles, references) - np.interp(-x, -quantiles[::-1], -references[::-1]))
            # no clamp of the values at the train minimum/maximum to levels 0/1 (scikit-learn's QuantileTransformer
            # clamps them): a value held by many rows at an end of the range (the zeros of a zero-inflated count,
            # and the rows imputed with that median) would land at -5.2 instead of the middle of its levels;
            # values beyond the train range still get level 0 or 1 from np.interp
            levels[:, j] = level
        clipped = np.clip(levels, LEVEL_MARGIN, 1.0 - LEVEL_MARGIN)
        return torch.special.ndtri(torch.from_numpy(clipped))

    def state_dict(self) -> dict[str, Any]:
        """The quantiles of each column, in plain lists."""
        return {"quantiles": [q.tolist() for q in self.quantiles or []]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Use saved quantiles (what ``state_dict`` returned)."""
        self.quantiles = [np.asarray(q, dtype=np.float64) for q in state["quantiles"]]


class RobustScaler:
    """Per column, ``z = (x - median) / (q75 - q25)`` over the fitted values, then the smooth clipping
    ``z / sqrt(1 + (z / 3) ** 2)`` (RealMLP's robust scaling): the middle half of the values keeps its spread, and
    outliers are squeezed into (-3, 3) instead of dominating the column.

    When the interquartile range is 0 (most values equal), the scale is half the range, ``(max - min) / 2``; when
    that is 0 too (a constant column), 1.0. Quantiles are ``np.quantile``'s (linear interpolation).
    """

    def __init__(self) -> None:
        self.median: np.ndarray | None = None
        self.scale: np.ndarray | None = None

    def fit(self, values: Tensor) -> "RobustScaler":
        """Learn the median and scale of each column of ``values`` (float, samples along dimension 0; NaN: missing)."""
        medians, scales = [], []
        for column in observed_columns(values):
            if not len(column):
                medians.append(0.0)
                scales.append(1.0)
                continue
            q25, median, q75 = np.quantile(column, [0.25, 0.5, 0.75])
            scale = q75 - q25
            if not scale > 0:
                scale = (column.max() - column.min()) / 2.0
            medians.append(float(median))
            scales.append(float(scale) if scale > 0 and math.isfinite(scale) else 1.0)
        self.median = np.asarray(medians, dtype=np.float64)
        self.scale = np.asarray(scales, dtype=np.float64)
        return self

    def transform(self, values: Tensor) -> Tensor:
        """Scale float64 ``values`` (no NaN) with the fitted median and scale: float64, same shape."""
        if self.median is None or self.scale is None:
            raise RuntimeError("RobustScaler.transform called before fit")
        z = (values.double() - torch.from_numpy(self.median)) / torch.from_numpy(self.scale)
        return z / torch.sqrt(1.0 + (z / SMOOTH_CLIP) ** 2)

    def state_dict(self) -> dict[str, Any]:
        """The median and scale of each column, in plain lists."""
        return {"median": [] if self.median is None else self.median.tolist(),
                "scale": [] if self.scale is None else self.scale.tolist()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Use a saved median and scale (what ``state_dict`` returned)."""
        self.median = np.asarray(state["median"], dtype=np.float64)
        self.scale = np.asarray(state["scale"], dtype=np.float64)


#: A fitted scaler of numeric columns.
NumericScaler = Union[Standardizer, QuantileScaler, RobustScaler]


#: The scalers that save their own state (``state_dict``), by ``scaling``; a ``Standardizer``'s mean and std are kept
#: in the encoding's own ``numeric_mean``/``numeric_std`` (the layout of encodings saved before the other scalings).
STATEFUL_SCALERS: dict[str, type[QuantileScaler] | type[RobustScaler]] = {
    "quantile": QuantileScaler,
    "robust": RobustScaler,
}


def fit_scaler(scaling: str, values: Tensor) -> NumericScaler:
    """The scaler of kind ``scaling`` fitted on ``values`` (float64, NaN: missing, left out of the statistics)."""
    if scaling == "standard":
        return fit_standardizer(values)
    if scaling in STATEFUL_SCALERS:
        return STATEFUL_SCALERS[scaling]().fit(values)
    raise ValueError(f"scaling must be one of {list(SCALINGS)}, got {scaling!r}")


__all__ = [
    "LEVEL_MARGIN", "MAX_QUANTILES", "NumericScaler", "QuantileScaler", "RobustScaler", "SCALINGS", "SMOOTH_CLIP",
    "STATEFUL_SCALERS", "ScalingKind", "fit_scaler", "fit_standardizer", "observed_columns",
]
