"""``recipes sync``: the journals of a folder of runs replayed into a tracking store (a store that failed during a
run, or a new store), with the checkpoint uploads an outage made fail."""

from __future__ import annotations

from pathlib import Path

from recipes.tracking.experiment_kind import create_experiment
from recipes.tracking.journal import JOURNAL_NAME, read_journal, replay
from recipes.tracking.pending_replay import mark_replayed
from recipes.tracking.recreated_runs import REPLAYED_FROM_TAG, restore_recreated_run
from recipes.tracking.database_urls import with_installed_driver
from recipes.tracking.uris import TrackingServerUnreachable, check_tracking_server, default_tracking_uri


def sync_journals(checkpoints_dir: Path, tracking_uri: str) -> list[str]:
    """Replay every journal under ``checkpoints_dir`` (``<experiment>/<run id>/tracking-journal.jsonl``) into the
    store at ``tracking_uri``: a merge that never writes over newer state in the store (``journal.replay``), so a
    folder whose journal is older than the store (a run resumed and ended elsewhere, a trial the sweep pruned) changes
    nothing. A run the store does not hold (a deleted or new store) is recreated in its experiment as a new run tagged
    ``loopwise.replayed_from_run``. Returns one line per journal: what was written, what was kept and why."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    from recipes.tracking.uploads import upload_missing_checkpoints  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    lines, seen = [], set()
    for path in sorted(checkpoints_dir.glob(f"*/*/{JOURNAL_NAME}")):
        folder = path.parent.resolve()  # a recreated run's new id is a link to its old id's folder: replayed once
        if folder in seen:
            continue
        seen.add(folder)
        run_id, experiment = folder.name, path.parent.parent.name
        entries = read_journal(path)
        try:
            client.get_run(run_id)
            target = run_id
        except MlflowException:
            found = client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else create_experiment(client, experiment)
            earlier = client.search_runs([experiment_id], f"tags.`{REPLAYED_FROM_TAG}` = '{run_id}'")
            target = (
                earlier[0].info.run_id
                if earlier
                else client.create_run(experiment_id, tags={REPLAYED_FROM_TAG: run_id}).info.run_id
            )
        summary = replay(entries, client, target, run_id if target != run_id else None)
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
        lines.append(line + (f", uploaded {', '.join(uploaded)}" if uploaded else ""))
    return lines


def main(argv: list[str] | None = None) -> int:
    """``recipes sync [--checkpoints_dir checkpoints]``: write the journals of runs whose store failed into the store
    (``MLFLOW_TRACKING_URI``, or ``./mlflow.db``)."""
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="recipes sync", description=main.__doc__)
    parser.add_argument("--checkpoints_dir", default="checkpoints", help="Where the runs' checkpoints are.")
    parser.add_argument("--tracking_uri", default=None, help="The store (default: MLFLOW_TRACKING_URI or ./mlflow.db).")
    args = parser.parse_args(argv)
    folder = Path(args.checkpoints_dir)
    if not folder.is_dir():
        print(f"recipes: error: {folder} is not a folder of checkpoints (--checkpoints_dir)", flush=True)
        return 2
    uri = with_installed_driver(args.tracking_uri) if args.tracking_uri else default_tracking_uri()
    try:
        check_tracking_server(uri)  # a server or a database that does not answer: one line, before any write
    except TrackingServerUnreachable as err:
        print(f"recipes: error: {err}", flush=True)
        return 2
    for line in sync_journals(folder, uri):
        print(f"recipes sync: {line}")
    return 0
