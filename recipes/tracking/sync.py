"""``recipes sync``: the journals of a folder of runs replayed into a tracking store (a store that failed during a
run, or a new store), with the checkpoint uploads an outage made fail.

Each journal is replayed into the run its entries name (the ``run_id`` of its "start" entries; the folder's name in
journals older than that): a folder copied aside (``<run id>.bak/``, a backup before an experiment) is reported in one
line and not replayed a second time, and a folder whose name is no run id is never taken for one. The command prints
one summary line (journals replayed, already complete, skipped); ``--verbose`` adds one line per journal.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.tracking.experiment_kind import create_experiment
from recipes.tracking.journal import JOURNAL_NAME, ReplaySummary, journal_run_id, read_journal, replay
from recipes.tracking.pending_replay import mark_replayed
from recipes.tracking.recreated_runs import REPLAYED_FROM_TAG, restore_recreated_run, runs_recreated_from
from recipes.tracking.database_urls import with_installed_driver
from recipes.tracking.sqlite_store import directory_lock, prepare_sqlite_store
from recipes.tracking.uris import TrackingServerUnreachable, check_tracking_server, default_tracking_uri

#: an MLflow run id (``uuid4().hex``): a folder named otherwise is not taken for a run's
RUN_ID = re.compile(r"[0-9a-f]{32}")


@dataclass
class SyncReport:
    """What a sync did: one line per journal replayed (``lines``), the journals skipped (``skipped``: one line each,
    why), and the counts of its summary."""

    lines: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    replayed: int = 0  # journals that wrote something into the store
    complete: int = 0  # journals the store already held in full (or held newer)
    recreated: int = 0  # runs the store lacked, created by this sync
    written: list[int] = field(default_factory=lambda: [0, 0, 0])  # metric values, params, tags

    def add(self, summary: ReplaySummary, line: str, recreated: bool) -> None:
        self.lines.append(line)
        if summary.wrote_nothing():
            self.complete += 1
        else:
            self.replayed += 1
        self.recreated += int(recreated)
        for index, count in enumerate((summary.metric_values, summary.params, summary.tags)):
            self.written[index] += count

    def summary(self, folder: Path) -> str:
        """The command's one line: the counts, and the one journal's line when there was only one."""
        metrics, params, tags = self.written
        recreated = f" ({self.recreated} recreated)" if self.recreated else ""
        line = (f"{len(self.lines) + len(self.skipped)} journal(s) under {folder}: {self.replayed} replayed"
                f"{recreated}, {self.complete} already complete, {len(self.skipped)} skipped; wrote {metrics} metric "
                f"value(s), {params} param(s), {tags} tag(s)")
        return f"{line}; {self.lines[0]}" if len(self.lines) == 1 else line


def journal_target(path: Path, entries: list[dict[str, Any]]) -> tuple[str | None, str | None]:
    """(the run id the journal at ``path`` is replayed into, ``None``) or (``None``, why it is skipped)."""
    folder = path.parent.resolve()
    named = journal_run_id(entries)
    if named is None:  # a journal older than the "run_id" of its start entries: the folder's name, if it is an id
        if RUN_ID.fullmatch(folder.name):
            return folder.name, None
        return None, (f"{path.parent} is not named after a run id and its journal names no run: not replayed; name "
                      "the folder after its run's id to replay it")
    if named != folder.name and (folder.parent / named / JOURNAL_NAME).is_file():
        return None, (f"{path.parent} holds a copy of run {named}'s journal (a folder copied aside?): not replayed "
                      f"twice, {folder.parent / named} is; move the copy out of the checkpoints folder to silence this")
    return named, None


def sync_folder(checkpoints_dir: Path, tracking_uri: str) -> SyncReport:
    """Replay every journal under ``checkpoints_dir`` (``<experiment>/<run folder>/tracking-journal.jsonl``) into the
    store at ``tracking_uri``, each into the run its entries name (``journal_target``): a merge that never writes over
    newer state in the store (``journal.replay``), so a folder whose journal is older than the store (a run resumed and
    ended elsewhere, a trial the sweep pruned) changes nothing. A run the store does not hold (a deleted or new store)
    is recreated in its experiment as a new run tagged ``loopwise.replayed_from_run``."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    report, seen = SyncReport(), set()
    journals = sorted(checkpoints_dir.glob(f"*/*/{JOURNAL_NAME}"))
    if not journals:
        return report
    prepare_sqlite_store(tracking_uri, None)  # two first commands on a new mlflow.db take turns creating it
    client = MlflowClient(tracking_uri)
    with directory_lock(checkpoints_dir.resolve()):  # two syncs of one folder: the second finds the runs complete
        for path in journals:
            folder = path.parent.resolve()  # a recreated run's new id is a link to its old id's folder: replayed once
            if folder not in seen:
                seen.add(folder)
                sync_journal(client, tracking_uri, path, report)
    return report


def sync_journal(client: Any, tracking_uri: str, path: Path, report: SyncReport) -> None:
    """Replay the journal at ``path`` into its run (``sync_folder``), adding what was done to ``report``."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    from recipes.tracking.uploads import upload_missing_checkpoints  # noqa: PLC0415

    folder = path.parent.resolve()
    experiment, entries = path.parent.parent.name, read_journal(path)
    run_id, problem = journal_target(path, entries)
    if run_id is None:
        report.skipped.append(str(problem))
        return
    created = False
    try:
        client.get_run(run_id)
        target = run_id
    except MlflowException:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else create_experiment(client, experiment)
        earlier = runs_recreated_from(client, [experiment_id], run_id)
        created = not earlier
        target = (
            earlier[0].info.run_id
            if earlier
            else client.create_run(experiment_id, tags={REPLAYED_FROM_TAG: run_id}).info.run_id
        )
    summary = replay(entries, client, target, run_id if target != run_id else None, folder)
    if target == run_id:  # the next command that reads this store need not replay it (pending_replay.py)
        mark_replayed(path, tracking_uri)
    line = summary.describe()
    uploaded = []
    if summary.continued_elsewhere:  # this folder's checkpoints are older than the run's: never sent over them
        line += "; checkpoints not uploaded (the run went on elsewhere after this journal)"
    else:
        uploaded = upload_missing_checkpoints(folder, client, target)  # the uploads a store outage made fail
    if target != run_id:  # after the checkpoints: the run's other local files, the link from the new id
        line += f" (recreated from {run_id}; {restore_recreated_run(client, tracking_uri, folder, target)})"
    report.add(summary, line + (f", uploaded {', '.join(uploaded)}" if uploaded else ""), created)


def sync_journals(checkpoints_dir: Path, tracking_uri: str) -> list[str]:
    """``sync_folder``'s lines: one per journal replayed, what was written, what was kept and why."""
    return sync_folder(checkpoints_dir, tracking_uri).lines


def sync_options(checkpoints_dir: str = "checkpoints", tracking_uri: str | None = None) -> None:
    """Replay the journals of a folder of runs into the tracking store (MLFLOW_TRACKING_URI, or ./mlflow.db): a store
    that failed during the runs, or a new store, with the checkpoint uploads an outage made fail.

    Args:
        checkpoints_dir: Where the runs' checkpoints are.
        tracking_uri: The store (default: MLFLOW_TRACKING_URI or ./mlflow.db).
    """


def build_parser() -> Any:
    """The options of ``recipes sync``: ``sync_options`` and ``--verbose``; a bad one raises ``ArgumentError``."""
    from jsonargparse import ActionYesNo, ArgumentParser  # noqa: PLC0415

    parser = ArgumentParser(prog="recipes sync", description=sync_options.__doc__.split("\n\n")[0],
                            exit_on_error=False)
    parser.add_function_arguments(sync_options, as_group=False)
    parser.add_argument("--verbose", action=ActionYesNo, default=False,
                        help="One line per journal: what was written and kept.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``recipes sync [--checkpoints_dir checkpoints] [--tracking_uri URI] [--verbose]``: ``sync_options``."""
    from jsonargparse import ArgumentError  # noqa: PLC0415

    try:
        args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    except ArgumentError as err:  # jsonargparse's lines, as one
        print(f"recipes sync: error: {' '.join(line.strip() for line in str(err).splitlines())} "
              "(recipes sync --help)", file=sys.stderr, flush=True)
        return 2
    folder = Path(args.checkpoints_dir)
    if not folder.is_dir():
        print(f"recipes: error: {folder} is not a folder of checkpoints (--checkpoints_dir)", file=sys.stderr,
              flush=True)
        return 2
    try:
        uri = with_installed_driver(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
        check_tracking_server(uri)  # a server or a database that does not answer: one line, before any write
    except (TrackingServerUnreachable, ValueError) as err:  # ValueError: a URL whose password cannot be read
        print(f"recipes: error: {err}", file=sys.stderr, flush=True)
        return 2
    report = sync_folder(folder, uri)
    for problem in report.skipped:
        print(f"recipes: warning: {problem}", file=sys.stderr, flush=True)
    if args.verbose and len(report.lines) > 1:
        for line in report.lines:
            print(f"recipes sync: {line}")
    print(f"recipes sync: {report.summary(folder)}", flush=True)
    return 0
