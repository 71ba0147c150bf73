"""``recipes compare --plot PATH``: each table's metric against the step, one line per training run.

One panel per table (per experiment), each with its own metric. A line's legend entry is the run's label, the same
text as the table's ``run`` column (``lr=0.003``), so the plot says which settings made which curve. Evaluation runs
(one value each) are not drawn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipes.compare.metric import lower_is_better
from recipes.compare.rows import EVALUATION_STAGES, RunsTable


def plot_curves(tables: list[RunsTable], path: str | Path) -> Any:
    """Save a PNG of each table's metric against step; returns the matplotlib ``Figure`` (one axis per table)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(8, 5 * len(tables)), dpi=100)
    FigureCanvasAgg(fig)
    for n, table in enumerate(tables, start=1):
        ax = fig.add_subplot(len(tables), 1, n)
        for row in table.rows:
            if row["stage"] in EVALUATION_STAGES:
                continue
            history = sorted(table.histories.get(row["id"], []), key=lambda m: (m.step, m.timestamp))
            if history:
                ax.plot([m.step for m in history], [m.value for m in history],
                        marker="." if len(history) < 50 else None, label=row["run"])
        ax.set_xlabel("step")
        ax.set_ylabel(table.metric)
        better = "lower" if lower_is_better(table.metric) else "higher"
        ax.set_title(f"{table.experiment}: {table.metric} ({better} is better)")
        ax.grid(True, alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(str(path), format="png")
    return fig


__all__ = ["plot_curves"]
