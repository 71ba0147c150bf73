"""``recipes compare --plot PATH``: each table's metric against the step, one line per training run.

One panel per table (per experiment), each with its own metric. A line's legend entry is the run's label, the same
text as the table's ``run`` column (``lr=0.003``, wrapped at spaces: ``wrap_label``), so the plot says which settings
made which curve. Evaluation runs (one value each) are not drawn.

The layout reads at 50 runs as at 2 (``build_figure``):

* the legend is outside the axes, never over the curves: to their right, one column, for up to ``RIGHT_LEGEND_MAX``
  runs; below the x axis beyond that, in as many columns as fit ``MAX_WIDTH_IN`` inches, in a smaller font (and
  smaller still beyond ``SMALL_LEGEND_MAX`` runs);
* the figure grows to hold it: wider by the legend's width (right), taller by its height (below);
* the title is wrapped at spaces to the width of its axes (never mid-word; the figure widens for a word longer
  than that);
* the y range is that of the runs' useful values (``y_limits``), not of the worst run's first steps; points outside
  it are still drawn, cut at the axes' edge;
* constrained layout places it all within the figure, and the PNG is saved with ``bbox_inches="tight"``.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any, Sequence

from recipes.compare.labels import wrap_label
from recipes.compare.metric import lower_is_better
from recipes.compare.rows import EVALUATION_STAGES, RunsTable

AXES_WIDTH_IN = 8.0  # one panel without its legend: the axes with their tick labels and y label
AXES_HEIGHT_IN = 4.5  # the same, with the title's first line and the x label
MAX_WIDTH_IN = 14.0  # a legend below the axes takes as many columns as fit this width
RIGHT_LEGEND_MAX = 10  # more runs than this: the legend goes below the axes, in columns
SMALL_LEGEND_MAX = 30  # more runs than this: the legend's font is smaller again
LEGEND_GAP_IN = 0.15  # between the x label and a legend below it
MARGIN_IN = 0.3  # around what constrained layout places
SKIP_FRACTION = 0.1  # of each run's first points, left out of the y range
PERCENTILES = (2.0, 98.0)  # of the kept values: the y range's core
NEAR = 0.5  # of the core's span: kept values this close beyond it widen the range to them
Y_MARGIN = 0.05  # of the y range, added at each end


def y_limits(series: Sequence[Sequence[float]]) -> tuple[float, float] | None:
    """The y range of curves ``series`` (each run's values in step order): their useful range, not the worst run's
    first steps. None when no value is finite.

    The rule, the same for a metric to minimize as for one to maximize:

    1. each run's first ``SKIP_FRACTION`` (10%) of points, rounded up, are left out: at least its first point, never
       its last (a run of 2-10 points loses its first, 11-20 its first two, ...);
    2. over the values kept from all runs together, the core range is the ``PERCENTILES`` (2nd to 98th
       percentile);
    3. it widens to the farthest kept values that lie within ``NEAR`` (half) of its span beyond either end: a
       curve's best or last points just past the core stay in view, a far outlier does not;
    4. ``Y_MARGIN`` (5%) of that range is added at each end (a flat range gets 5% of its value, or 0.05 at 0).

    When no run has more than one point, nothing is left out and the range is the full one (min to max). Values
    that are not finite (NaN, inf) are left out. Points outside the range are still plotted, cut at the axes.
    """
    import numpy as np  # noqa: PLC0415 - matplotlib's own dependency; only --plot needs it

    runs = [[v for v in values if math.isfinite(v)] for values in series]
    runs = [values for values in runs if values]
    if not runs:
        return None
    if all(len(values) == 1 for values in runs):
        low, high = min(v[0] for v in runs), max(v[0] for v in runs)
    else:
        kept = [v for values in runs for v in values[math.ceil(len(values) * SKIP_FRACTION):]]
        low, high = (float(x) for x in np.percentile(np.asarray(kept, dtype=float), PERCENTILES))
        reach = (high - low) * NEAR
        low = min(v for v in kept if v >= low - reach)
        high = max(v for v in kept if v <= high + reach)
    span = high - low
    pad = span * Y_MARGIN if span > 0 else (abs(high) * Y_MARGIN or Y_MARGIN)
    return low - pad, high + pad


def _histories(table: RunsTable) -> list[tuple[str, list[Any]]]:
    """(label, history in step order) of each training run of ``table`` that logged its metric."""
    curves = []
    for row in table.rows:
        if row["stage"] in EVALUATION_STAGES:
            continue
        history = sorted(table.histories.get(row["id"], []), key=lambda m: (m.step, m.timestamp))
        if history:
            curves.append((row["run"], history))
    return curves


def _inches(bbox: Any, dpi: float) -> tuple[float, float]:
    return bbox.width / dpi, bbox.height / dpi


def _place_legend(ax: Any, renderer: Any, dpi: float, dpi_scale: Any) -> str:
    """Put ``ax``'s legend outside it: ``"right"`` (few runs) or ``"below"`` (in columns); returns which."""
    from matplotlib.transforms import ScaledTranslation  # noqa: PLC0415

    count = len(ax.get_lines())
    if count <= RIGHT_LEGEND_MAX:
        ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small")
        return "right"
    fontsize = "small" if count <= SMALL_LEGEND_MAX else "x-small"
    column, _ = _inches(ax.legend(fontsize=fontsize).get_window_extent(renderer), dpi)  # one column's width
    ncol = max(1, min(count, int((MAX_WIDTH_IN - 2 * MARGIN_IN) // column)))
    ncol = math.ceil(count / math.ceil(count / ncol))  # rows as even as they go
    axis_depth = (ax.get_window_extent(renderer).y0 - ax.xaxis.get_tightbbox(renderer).y0) / dpi  # ticks, x label
    below = ax.transAxes + ScaledTranslation(0.0, -(axis_depth + LEGEND_GAP_IN), dpi_scale)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=below, borderaxespad=0.0,
              fontsize=fontsize, ncol=ncol)
    return "below"


def _wrap_title(ax: Any, title: str, width_px: float, renderer: Any) -> None:
    """``ax``'s title on as few lines as fit ``width_px``, broken at spaces only."""
    text = ax.set_title(title)
    chars = len(title)
    while chars > 1 and text.get_window_extent(renderer).width > width_px:
        chars = min(chars - 1, max(len(line) for line in text.get_text().split("\n")) - 1)
        text.set_text("\n".join(textwrap.wrap(title, chars, break_long_words=False, break_on_hyphens=False)))


def build_figure(tables: list[RunsTable]) -> Any:
    """The matplotlib ``Figure`` of ``tables``' curves, one axes per table (in order), laid out to be saved as it is
    (see the module's docstring); the legends' and titles' places are final after a draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(AXES_WIDTH_IN, AXES_HEIGHT_IN * max(1, len(tables))), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    titles = []
    for n, table in enumerate(tables, start=1):
        ax = fig.add_subplot(len(tables), 1, n)
        curves = _histories(table)
        for label, history in curves:
            ax.plot([m.step for m in history], [m.value for m in history],
                    marker="." if len(history) < 50 else None, label=wrap_label(label))
        limits = y_limits([[m.value for m in history] for _, history in curves])
        if limits is not None:
            ax.set_ylim(*limits)
        ax.set_xlabel("step")
        ax.set_ylabel(table.metric)
        better = "lower" if lower_is_better(table.metric) else "higher"
        titles.append(f"{table.experiment}: {table.metric} ({better} is better)")
        ax.set_title(titles[-1])
        ax.grid(True, alpha=0.3)

    fig.draw_without_rendering()
    renderer, dpi = fig.canvas.get_renderer(), fig.dpi
    places = [_place_legend(ax, renderer, dpi, fig.dpi_scale_trans) if ax.get_lines() else None for ax in fig.axes]
    legends = [_inches(ax.get_legend().get_window_extent(renderer), dpi) if place else (0.0, 0.0)
               for ax, place in zip(fig.axes, places)]
    width = max([AXES_WIDTH_IN] + [AXES_WIDTH_IN + w + MARGIN_IN if place == "right" else w + 2 * MARGIN_IN
                                   for place, (w, _) in zip(places, legends)])
    heights = [AXES_HEIGHT_IN + h + LEGEND_GAP_IN if place == "below"
               else max(AXES_HEIGHT_IN, h + 1.5) if place == "right" else AXES_HEIGHT_IN
               for place, (_, h) in zip(places, legends)]
    fig.set_size_inches(width, sum(heights))

    # the titles: wrapped to their axes' width, the figure taller by their extra lines (wider for a long word)
    fig.draw_without_rendering()
    line = None
    for ax, title, n in zip(fig.axes, titles, range(len(titles))):
        if line is None:
            line = ax.title.get_window_extent(renderer).height / dpi
        _wrap_title(ax, title, ax.get_window_extent(renderer).width, renderer)
        heights[n] += (ax.title.get_text().count("\n")) * line
        title_width, _ = _inches(ax.title.get_window_extent(renderer), dpi)
        extra = title_width - ax.get_window_extent(renderer).width / dpi
        if extra > 0:
            width += extra
    fig.set_size_inches(width, sum(heights))
    fig.draw_without_rendering()
    return fig


def save_figure(fig: Any, path: str | Path) -> None:
    """Write ``fig`` as a PNG to ``path``, cropped to what it draws (nothing cut: ``bbox_inches="tight"``)."""
    fig.savefig(str(path), format="png", bbox_inches="tight", pad_inches=0.1)


def plot_curves(tables: list[RunsTable], path: str | Path) -> Any:
    """Save a PNG of each table's metric against step; returns the matplotlib ``Figure`` (one axis per table)."""
    fig = build_figure(tables)
    save_figure(fig, path)
    return fig


__all__ = ["build_figure", "plot_curves", "save_figure", "y_limits"]
