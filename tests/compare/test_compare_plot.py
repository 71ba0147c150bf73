"""`recipes compare --plot` at 1, 5 and 20 runs: the legend beside or below the axes (never over them), legend and
title within the figure, a y range that the worst run's first steps do not set, and labels that name a swept value
once and wrap at spaces only.

Runs are made directly in a temporary SQLite store, as in test_compare.py (its ``Store``).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from recipes.compare.command import build_parser, collect_tables
from recipes.compare.labels import run_labels, wrap_label
from recipes.compare.plot import build_figure, plot_curves, y_limits
from recipes.compare.run_filter import parse_filter
from tests.compare.test_compare import ACC_CONFIG, Store, curve

LONG_EXPERIMENT = ("a_sweep_of_the_spiral_recipe_with_a_name_long_enough_to_wrap its title at word boundaries even"
                   " when the figure is as wide as a legend of twenty runs makes it")
LRS = ("0.1", "0.03", "0.01", "0.003", "0.001")


@pytest.fixture
def store(workdir) -> Store:
    return Store(workdir)


def add_runs(store: Store, count: int, experiment: str = LONG_EXPERIMENT, metric: str = "val/loss") -> None:
    """``count`` fit runs whose lr is logged twice (``lr`` and the config's ``optimizer.lr``, once as ``1e-3``)."""
    for i in range(count):
        lr = LRS[i % len(LRS)]
        spelled = f"{float(lr):.0e}".replace("e-0", "e-") if i % 2 else lr  # 0.03 -> 3e-2: the same setting
        params = {"lr": lr, "model.init_args.optimizer.init_args.lr": spelled, "optimizer.lr": lr,
                  "batch_size": 2 ** (4 + i // len(LRS)), "hidden": f"[{64 + i}, {64 + i}]", "seed": 0}
        values = [0.5 - 0.3 * (k / 9) * (1 + i / 40) for k in range(10)]
        store.run(experiment, params, {metric: curve(values)}, config=ACC_CONFIG if metric == "val/acc" else None)


def tables_of(store: Store, *args: str):
    parsed = build_parser().parse_args(["--tracking-uri", store.uri, *args])
    return collect_tables(store.client, parsed, parse_filter(None))


def inside(inner, outer, slack: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.y0 >= outer.y0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y1 <= outer.y1 + slack)


@pytest.mark.parametrize("count", [1, 5, 20])
def test_legend_beside_the_axes_and_title_within_the_figure(store, capsys, workdir, count):
    add_runs(store, count)
    code, _, err = store.compare(capsys, "--plot", "curves.png")  # the command line writes the same file as before
    assert code == 0 and (workdir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "plot: curves.png" in err

    [table] = tables_of(store)
    fig = plot_curves([table], workdir / "direct.png")
    fig.canvas.draw()
    [ax] = fig.axes
    legend, axes_box = ax.get_legend(), ax.get_window_extent()
    legend_box, title_box = legend.get_window_extent(), ax.title.get_window_extent()
    assert len(legend.get_texts()) == count
    assert not legend_box.overlaps(axes_box), (legend_box, axes_box)
    assert inside(legend_box, fig.bbox) and inside(title_box, fig.bbox), (legend_box, title_box, fig.bbox)
    assert inside(axes_box, fig.bbox)
    if count <= 10:
        assert legend_box.x0 >= axes_box.x1  # to the right
    else:
        assert legend_box.y1 <= axes_box.y0 and fig.get_size_inches()[1] > 5  # below, the figure taller for it
        assert legend_box.height < 0.75 * count * legend.get_texts()[0].get_window_extent().height  # in columns
    title = f"{LONG_EXPERIMENT}: val/loss (lower is better)"
    assert ax.title.get_text().replace("\n", " ") == title  # wrapped at spaces, no word cut
    assert ax.title.get_text().count("\n") >= 1 and title_box.width <= axes_box.width + 1
    labels = [row["run"] for row in table.rows]
    assert [t.get_text().replace("\n", " ") for t in legend.get_texts()] == labels  # no word broken across lines
    assert all(len(line) <= 36 or " " not in line for t in legend.get_texts() for line in t.get_text().split("\n"))


def test_two_tables_each_with_its_legend_outside_its_axes(store, workdir):
    add_runs(store, 3, "small")
    add_runs(store, 20, "large")
    fig = plot_curves(tables_of(store), workdir / "two.png")
    fig.canvas.draw()
    boxes = [ax.get_window_extent() for ax in fig.axes]
    legends = [ax.get_legend().get_window_extent() for ax in fig.axes]
    assert sorted(len(ax.get_legend().get_texts()) for ax in fig.axes) == [3, 20]
    for legend in legends:
        assert inside(legend, fig.bbox) and not any(legend.overlaps(box) for box in boxes)
    assert not legends[0].overlaps(legends[1])


def test_y_range_is_not_set_by_a_run_s_first_steps(store, workdir):
    store.run("e", {"lr": "1"}, {"val/loss": curve([50.0, 0.45, 0.4, 0.35, 0.3, 0.3, 0.28, 0.27, 0.26, 0.25])})
    for i in range(5):
        store.run("e", {"lr": f"0.0{i + 1}"}, {"val/loss": curve([0.5 - 0.02 * k - 0.03 * i for k in range(10)])})
    [table] = tables_of(store)
    fig = build_figure([table])
    [ax] = fig.axes
    low, high = ax.get_ylim()
    assert high < 1.0 and 0.0 < low < 0.2, (low, high)  # the best run's lowest point (0.2) in view
    assert 50.0 in [y for line in ax.get_lines() for y in line.get_ydata()]  # still plotted, cut at the axes

    # the same rule for a metric to maximize: a run that starts at 0 does not stretch the range down
    store.run("acc", {"lr": "1"}, {"val/acc": curve([0.0, 0.8, 0.85, 0.9, 0.91])}, config=ACC_CONFIG)
    store.run("acc", {"lr": "2"}, {"val/acc": curve([0.7, 0.82, 0.86, 0.88, 0.93])}, config=ACC_CONFIG)
    fig = build_figure(tables_of(store, "--experiment", "acc"))
    low, high = fig.axes[0].get_ylim()
    assert 0.7 < low < 0.8 and 0.93 <= high < 1.0, (low, high)


def test_y_limits_rule():
    assert y_limits([]) is None and y_limits([[math.nan]]) is None
    assert y_limits([[0.2], [0.4]]) == pytest.approx((0.19, 0.41))  # one point per run: the full range, 5% margin
    low, high = y_limits([[50.0] + [0.3] * 9, [0.2 + 0.01 * k for k in range(10)]])
    assert high < 1.0 and low > 0.1
    assert y_limits([[0.5, 0.5]]) == pytest.approx((0.475, 0.525))  # flat: 5% of the value
    assert y_limits([[0.0, 0.0, math.inf]]) == pytest.approx((-0.05, 0.05))


def fake_run(params: dict, run_id: str) -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(params=params), info=SimpleNamespace(run_id=run_id, run_name="r"))


def test_labels_name_a_swept_value_once_under_its_short_name(store, capsys):
    add_runs(store, 6, "e")
    rows = store.rows(capsys)
    for row in rows:
        words = row["run"].split()
        assert [w for w in words if w.startswith("lr=")] == [f"lr={row['params.lr']}"], row["run"]
        assert not any(w.startswith(("optimizer.lr=", "model.")) for w in words) and "seed=" not in row["run"]
    # the long names stay in the rows (CSV/JSON), only the label names the setting once
    assert "params.model.init_args.optimizer.init_args.lr" in rows[0] and "params.optimizer.lr" in rows[0]

    runs = [fake_run({"lr": "0.001", "optimizer.lr": "1e-3", "sweep.model.optimizer.lr": "0.0010", "n": "1"}, "a" * 32),
            fake_run({"lr": "0.01", "optimizer.lr": "1e-2", "sweep.model.optimizer.lr": "0.01", "n": "2"}, "b" * 32)]
    labels, named = run_labels(runs, ["fit", "fit"])
    assert labels == ["lr=0.001 n=1", "lr=0.01 n=2"] and named == ["lr", "n"]
    different = [fake_run({"lr": "0.001", "optimizer.lr": "0.1"}, "a" * 32),
                 fake_run({"lr": "0.01", "optimizer.lr": "0.2"}, "b" * 32)]
    assert run_labels(different, ["fit", "fit"])[0] == ["lr=0.001 optimizer.lr=0.1", "lr=0.01 optimizer.lr=0.2"]


def test_wrap_label_breaks_at_spaces_only():
    label = "batch_size=64 lr=0.001 hidden=[128,128,128,128] optimizer=AdamW data=" + "x" * 40
    wrapped = wrap_label(label, 20)
    assert wrapped.replace("\n", " ") == label
    assert all(line in label.split() or len(line) <= 20 for line in wrapped.split("\n"))
    assert "data=" + "x" * 40 in wrapped.split("\n")  # a word longer than the width keeps its line, whole
    assert wrap_label("lr=0.1") == "lr=0.1"
