"""What a person sees: one titled table per experiment, fitted to the terminal, with notes below it.

The title names the experiment, how many runs of which stage, the metric (which way is better; the split an
evaluation run logged it under) and the data the runs share. Columns: ``run`` (what differs), ``id`` (8
characters), ``stage`` (with ``--stage all`` or mixed stages), ``status``, ``by`` (``user@host``: who ran it, on
which machine; left out when no run recorded it), ``data`` (``same`` / ``differs: <splits>`` / ``-``; left out when
no run recorded data), ``started`` (local time), ``time`` (duration), ``best``, ``last`` and ``best epoch`` (from
1, as the epoch lines; left out when no run has one). On a narrow terminal ``started``, ``time`` and ``by`` are left
out first, then the data and label columns wrap, then ``status``, ``last``
and ``best epoch`` are left out, in that order; what was left out is named below the table.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from recipes.compare.metric import lower_is_better
from recipes.compare.rows import RunsTable
from recipes.compare.table import Column, render_table, wrap_note


def human_duration(seconds: float | None) -> str:
    """``12.3s``, ``3m04s``, ``2h05m`` (blank while a run runs)."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def local_start(iso: str) -> str:
    """``2026-01-02T03:04:05Z`` as local ``01-02 04:04``."""
    if not iso:
        return ""
    moment = datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).astimezone()
    return moment.strftime("%m-%d %H:%M")


def table_columns(table: RunsTable, show_stage: bool) -> list[Column]:
    """The columns a person sees for ``table`` (see the module docstring)."""
    columns = [Column("run", "run", wrap=True, min_width=12), Column("id", "id")]
    if show_stage:
        columns.append(Column("stage", "stage"))
    columns.append(Column("status", "status", drop=3))
    if any(row["by"] for row in table.rows):
        columns.append(Column("by", "by", drop=4))
    if any(row["data"] != "-" for row in table.rows):
        columns.append(Column("data", "data", wrap=True, min_width=8, give=1))
    columns += [
        Column("started", "started", drop=6),
        Column("time", "time", numeric=True, drop=5),
        Column("best", "best", numeric=True),
        Column("last", "last", numeric=True, drop=2),
    ]
    if any(row["best epoch"] is not None for row in table.rows):
        columns.append(Column("best epoch", "best epoch", numeric=True, drop=1))
    return columns


def title(table: RunsTable) -> str:
    """``spiral_mlp: 3 fit runs, val/acc (higher is better); data SpiralDataModule: train 693611d8 val 7c9526c6``."""
    counts: dict[str, int] = {}
    for row in table.rows:
        counts[row["stage"]] = counts.get(row["stage"], 0) + 1
    if len(counts) == 1:
        stage, n = next(iter(counts.items()))
        runs = f"{n} {stage} run{'s' if n > 1 else ''}"
    else:
        runs = f"{len(table.rows)} runs ({', '.join(f'{s} {n}' for s, n in counts.items())})"
    better = "lower" if lower_is_better(table.metric) else "higher"
    other = sorted({row["metric"] for row in table.rows if row["metric"] != table.metric})
    own = f"; {', '.join(other)} for evaluation runs" if other else ""
    return f"{table.experiment}: {runs}, {table.metric} ({better} is better{own}); data {table.data}"


def notes(table: RunsTable, dropped: list[str], width: int) -> list[str]:
    """The lines below a table: what was left out, and why."""
    out: list[str] = []
    if len(table.rows) == 1:
        out.append("(one run: no params to compare)")
    elif not table.params:
        out.append("(no params differ between these runs)")
    unnamed = [p for p in table.params if p not in table.label_params]
    if unnamed:
        out.append(f"(+{len(unnamed)} differing params that follow from the ones named, e.g. {unnamed[0]}; "
                   "--format csv/json lists every param)")
    for row in table.rows:
        if row.get("resumed from"):
            source, _, step = row["resumed from"].partition(" @ step ")
            out.append(f"(run {row['id'][:8]} is a branch: resumed from step {step} of run {source[:8]}; its history "
                       f"before that step is {source[:8]}'s, what {source[:8]} logged after it is not {row['id'][:8]}'s)")
    if dropped:
        out.append(f"(left out to fit {width} columns: {', '.join(dropped)}; --format csv/json has every column)")
    return [line for note in out for line in wrap_note(note, width)]


def render_report(table: RunsTable, show_stage: bool, width: int) -> list[str]:
    """The title, the table and its notes, every line at most ``width`` characters."""
    display: list[dict[str, Any]] = [
        {**row, "id": row["id"][:8], "started": local_start(row["start"]), "time": human_duration(row["duration (s)"])}
        for row in table.rows
    ]
    lines, dropped = render_table(display, table_columns(table, show_stage), width)
    return [*wrap_note(title(table), width), *lines, *notes(table, dropped, width)]


__all__ = ["human_duration", "local_start", "notes", "render_report", "table_columns", "title"]
