"""``recipes compare``: MLflow runs side by side, for people: one table per experiment, what differs, the scores.

Usage (dispatched by ``recipes compare ...``; ``main`` takes the arguments after ``compare``)::

    recipes compare                                  # a table per experiment, fit runs, each its monitored metric
    recipes compare --experiment spiral_mlp --metric val/acc --plot curves.png
    recipes compare --filter "params.lr > 0.001" --sort best
    recipes compare --stage all --format csv > runs.csv

Where each decision lives:

* which runs (store, experiments, ``--stage``, ``--max-runs``): ``compare_runs``; ``--filter``: ``compare_filter``;
* which metric and which way is better: ``compare_metric``; the rows and ``best epoch``: ``compare_rows``;
* the run labels (what differs): ``compare_labels``; the data column: ``compare_data``; ``--sort``: ``compare_sort``;
* the text layout (terminal width, wrapping): ``compare_table`` and ``compare_report``; ``--plot``: ``compare_plot``;
* ``--sweep``: ``compare_sweep``.

A missing SQLite file, an unknown experiment, no matching runs, a metric no run logged, a bad ``--filter`` or
``--sort``, or an unreachable tracking server end with one ``recipes compare: error:`` line and exit code 2.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Literal

from jsonargparse import ArgumentError, ArgumentParser, Namespace

from recipes.compare.errors import PROG, CompareError
from recipes.compare.run_filter import RunFilter, parse_filter
from recipes.compare.labels import differing_params
from recipes.compare.metric import choose_metric, lower_is_better, summarize_history
from recipes.compare.plot import plot_curves
from recipes.compare.report import render_report
from recipes.compare.rows import RunsTable, build_table
from recipes.compare.runs import STAGE_TAG, STAGES, check_sqlite, find_experiments, search_runs
from recipes.compare.sort import KEYS, parse_sort, sort_table
from recipes.compare.table import format_csv, format_json, format_table, terminal_width
from recipes.tracking.database_urls import (
    AmbiguousCredentials,
    DatabaseUnavailable,
    check_database,
    masked_url,
    with_installed_driver,
)
from recipes.tracking.failures import fast_http_failures, short_reason
from recipes.tracking.abandoned_runs import close_before_reading
from recipes.tracking.pending_replay import replay_before_reading
from recipes.tracking.uris import TrackingServerUnreachable, check_tracking_server, default_tracking_uri


def compare_options(  # noqa: PLR0913 - the command's options, read from this signature and docstring
    experiment: str | None = None,
    metric: str | None = None,
    tracking_uri: str | None = None,
    stage: Literal["fit", "validate", "test", "predict", "all"] = "fit",
    filter: str | None = None,  # noqa: A002 - the option's name
    sort: str | None = None,
    format: Literal["table", "csv", "json"] = "table",  # noqa: A002 - the option's name
    plot: str | None = None,
    max_runs: int = 50,
    sweep: str | None = None,
    checkpoints_dir: str = "checkpoints",
) -> None:
    """Compare MLflow runs: a table per experiment with what differs, the data, and the best/last value of the
    monitored metric. Every option may be spelled with dashes too (--max-runs, --tracking-uri, --checkpoints-dir).

    Args:
        experiment: experiment name (default: a table per experiment)
        metric: metric to compare (default: each recipe's monitored metric, else val/loss)
        tracking_uri: MLflow tracking URI (default: MLFLOW_TRACKING_URI or ./mlflow.db)
        stage: runs of this stage only
        filter: MLflow search filter, e.g. "params.lr > 0.001 and metrics.`val/acc` > 0.9" (params compared with a
            number are compared as numbers)
        sort: row order, KEY[:asc|:desc] with KEY one of best, last, start, duration, epoch, status, stage, run, data,
            params.NAME, metrics.NAME (default: newest first; best and metrics: better first)
        format: output format
        plot: also write a PNG of the metric's curves to this path
        max_runs: newest N runs per experiment
        sweep: the trials of a sweep (parent run id or study name)
        checkpoints_dir: the run journals under this folder are replayed into the store first: the last values of
            runs killed before the store had them
    """


#: the options of ``compare_options`` spelled with dashes, as ``recipes compare`` has always taken them
DASHED = {f"--{name.replace('_', '-')}": f"--{name}" for name in inspect.signature(compare_options).parameters
          if "_" in name}


def underscored(arg: str) -> str:
    """``--max-runs`` (or ``--max-runs=3``) as ``--max_runs``; any other argument as it is."""
    name, equals, value = arg.partition("=")
    return DASHED.get(name, name) + equals + value


class CompareParser(ArgumentParser):
    """jsonargparse's parser of ``compare_options``, taking each option with dashes too (``--max-runs``)."""

    def parse_args(self, args: list[str] | None = None, *more: Any, **kwargs: Any) -> Namespace:  # type: ignore
        given = sys.argv[1:] if args is None else args
        return super().parse_args([underscored(arg) for arg in given], *more, **kwargs)


def build_parser() -> CompareParser:
    """The options of ``recipes compare`` (``compare_options``); a bad one raises ``ArgumentError``."""
    parser = CompareParser(prog=PROG, description=compare_options.__doc__.split("\n\n")[0], exit_on_error=False)
    parser.add_function_arguments(compare_options, as_group=False)
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def collect_tables(client: Any, args: Namespace, run_filter: RunFilter) -> list[RunsTable]:
    """One table per experiment with matching runs, each on its own metric, rows in ``--sort`` order."""
    tables: list[RunsTable] = []
    skipped: list[str] = []
    unsorted: list[str] = []
    for experiment in find_experiments(client, args.experiment):
        runs, left_out = search_runs(client, experiment.experiment_id, args.stage, run_filter, args.max_runs)
        if not runs:
            continue
        try:
            metric = choose_metric(client, runs, args.metric)
        except CompareError as err:
            skipped.append(f"experiment {experiment.name}: {err}")
            continue
        table = build_table(client, runs, metric, experiment.name, left_out)
        try:
            order = sort_table(table.rows, table.runs, args.sort, metric)
        except CompareError as err:  # e.g. a param these runs lack: their table keeps its order, unless all do
            unsorted.append(str(err))
            order = list(range(len(table.rows)))
        table.rows, table.runs = [table.rows[i] for i in order], [table.runs[i] for i in order]
        tables.append(table)
    if unsorted and len(unsorted) == len(tables):
        raise CompareError(unsorted[0])
    if not tables and skipped:
        raise CompareError(skipped[0] if len(skipped) == 1 else "; ".join(skipped))
    if not tables:
        where = f"experiment {args.experiment!r}" if args.experiment else "any experiment"
        stage = "" if args.stage == "all" else f" with stage {args.stage!r}"
        matching = f" matching --filter {run_filter.text!r}" if run_filter.text else ""
        hint = " (try --stage all)" if args.stage != "all" and not matching else ""
        raise CompareError(f"no runs in {where}{stage}{matching} at {masked_url(client.tracking_uri)}{hint}")
    for line in skipped:
        print(f"compare: {line} (left out)", file=sys.stderr)
    for line in dict.fromkeys(unsorted):
        print(f"compare: {line} (a table left in its order)", file=sys.stderr)
    return tables


def write_output(tables: list[RunsTable], args: Namespace) -> None:
    """The tables on stdout as text (fitted to the terminal), CSV or JSON; notes on stderr."""
    for table in tables:
        if table.left_out:
            shown = len(table.rows)
            print(f"compare: showing the newest {shown} of {shown + table.left_out} matching runs of "
                  f"{table.experiment}; {table.left_out} left out (--max-runs {args.max_runs})", file=sys.stderr)
    rows = [row for table in tables for row in table.rows]
    if args.format == "csv":
        sys.stdout.write(format_csv(rows))
    elif args.format == "json":
        sys.stdout.write(format_json(rows))
    else:
        width = terminal_width()
        blocks = ["\n".join(render_report(t, args.stage == "all" or len(t.stages) > 1, width)) for t in tables]
        sys.stdout.write("\n\n".join(blocks) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``recipes compare``; ``argv`` excludes the word ``compare``. Returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except ArgumentError as err:  # jsonargparse's lines, as one
        return _error(f"{' '.join(line.strip() for line in str(err).splitlines())} (recipes compare --help)")
    if args.max_runs < 1:
        return _error("--max-runs must be at least 1")
    try:
        uri = with_installed_driver(args.tracking_uri or default_tracking_uri())  # postgresql://: the driver installed
    except ValueError as err:  # a URL whose password cannot be read unambiguously (AmbiguousCredentials)
        return _error(str(err))
    try:
        from mlflow.exceptions import MlflowException  # noqa: PLC0415
        from mlflow.tracking import MlflowClient  # noqa: PLC0415
        from requests.exceptions import RequestException  # noqa: PLC0415
    except ImportError as err:  # pragma: no cover - mlflow is a dependency
        return _error(f"mlflow is required: {err}")

    try:
        if args.sort:
            parse_sort(args.sort)
        run_filter = parse_filter(args.filter)
        check_sqlite(uri)
        check_database(uri, "tracking store")  # PostgreSQL/MySQL: driver, answer, login (one line, password masked)
        check_tracking_server(uri)  # a server: one request, a few seconds at most, its reason in a few words
        with fast_http_failures(uri):
            replay_before_reading(uri, args.checkpoints_dir, PROG)  # the store written behind the journals
            close_before_reading(uri, PROG)  # runs (and sweep parents) whose processes are gone: KILLED
            client = MlflowClient(tracking_uri=uri)
            if args.sweep:
                from recipes.compare.study import show_sweep  # noqa: PLC0415

                return show_sweep(client, args)
            tables = collect_tables(client, args, run_filter)
    except (CompareError, DatabaseUnavailable, TrackingServerUnreachable, AmbiguousCredentials) as err:
        return _error(str(err))
    except (MlflowException, RequestException, ConnectionError, OSError) as err:
        return _error(f"cannot read the tracking store at {masked_url(uri)}: {short_reason(err)}")

    write_output(tables, args)
    if args.plot:
        try:
            plot_curves(tables, args.plot)
        except OSError as err:
            return _error(f"cannot write the plot {args.plot}: {err}")
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


__all__ = ["CompareError", "STAGE_TAG", "build_parser", "collect_tables", "differing_params", "format_csv",
           "format_json", "format_table", "lower_is_better", "main", "plot_curves", "summarize_history"]

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
