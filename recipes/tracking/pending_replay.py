"""The journals a loopwise command replays before it reads a tracking store (the journal is the write-ahead log).

A recipe fit writes the store behind its journal (``recipes.tracking.write_behind``): a run killed with ``kill -9``
may leave the store behind its journal. So every command that reads a store (``recipes compare``, ``--ckpt_path
best|last``, ``run:<id>/...``, ``mlflow:<id>/...``; ``recipes sync`` replays everything anyway) first calls
``replay_pending``: the journals it knows of are those under its checkpoints folder (``checkpoints/`` unless the
command names another), ``<experiment>/<run id>/tracking-journal.jsonl``, whose run is in that store. Each is merged
by ``journal.replay``, whose rules never make the record worse (metric steps the store lacks, params and tags it
lacks, the status only when the journal's is newer: a run whose last attempt never ended is ended KILLED).

It stays cheap when there is nothing to replay: ``<checkpoints_dir>/.replayed/<experiment>/<run id>.json`` records,
per store (a hash of its URI, never the URI: it may hold a password), the journal's size and modification time when
it was last merged into that store. A journal that has not changed since is skipped after one ``stat``; a run that ended normally writes it at its end (everything reached the store), and so does ``recipes
sync``. A journal whose run is not in the store is looked up again at every command (one ``get_run``). A journal whose last
attempt is still running (its process is alive on this host; on another host, it wrote within the last
``OTHER_HOST_QUIET_SECONDS``) is left alone: its own process writes the store within seconds, and a replay beside it
would write the same values twice (MLflow keeps every write).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from recipes.tracking.journal import JOURNAL_NAME, attempt_alive, journal_run_id, read_journal, replay

MARKERS_DIR = ".replayed"  # <checkpoints_dir>/.replayed/<experiment>/<run id>.json (run folders hold only theirs)
OTHER_HOST_QUIET_SECONDS = 300


def store_key(tracking_uri: str) -> str:
    """The marker's key for a store: a hash of its URI (a URI may hold a password)."""
    return hashlib.sha256(tracking_uri.encode()).hexdigest()[:16]


def journal_stamp(path: Path) -> list[int]:
    """The journal's size and modification time (ns): what changes with every entry."""
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def marker_path(journal: Path) -> Path:
    """Where the stores a journal was merged into are recorded: ``<checkpoints_dir>/.replayed/<experiment>/<run
    id>.json`` for ``<checkpoints_dir>/<experiment>/<run id>/tracking-journal.jsonl``."""
    run_folder = journal.parent
    return run_folder.parent.parent / MARKERS_DIR / run_folder.parent.name / f"{run_folder.name}.json"


def read_marker(journal: Path) -> dict[str, Any]:
    """The stores this journal was merged into, with its stamp at the time (``{}`` when none, or unreadable)."""
    try:
        found = json.loads(marker_path(journal).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def mark_replayed(journal: Path, tracking_uri: str) -> None:
    """Record that ``journal``, as it is now, is merged into the store at ``tracking_uri`` (written atomically)."""
    try:
        marker = read_marker(journal)
        marker[store_key(tracking_uri)] = journal_stamp(journal)
        target = marker_path(journal)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.parent / f".{target.name}.{os.getpid()}"
        temporary.write_text(json.dumps(marker), encoding="utf-8")
        os.replace(temporary, target)
    except OSError:
        pass  # a folder that cannot be written: the journal is merged again next time (a merge changes nothing)


def is_replayed(journal: Path, tracking_uri: str) -> bool:
    """Whether ``journal`` is unchanged since it was merged into the store at ``tracking_uri``."""
    try:
        return read_marker(journal).get(store_key(tracking_uri)) == journal_stamp(journal)
    except OSError:
        return False


def still_written(entries: list[dict[str, Any]], journal: Path) -> bool:
    """Whether the journal's last attempt may still be running (see the module's docstring)."""
    attempt = next((e for e in reversed(entries) if e.get("kind") == "start"), None)
    if attempt is None or any(e.get("kind") == "status" for e in entries[entries.index(attempt):]):
        return False
    if attempt.get("host") != socket.gethostname():
        return time.time() - journal.stat().st_mtime < OTHER_HOST_QUIET_SECONDS
    return attempt_alive(attempt)


def replay_pending(tracking_uri: str, checkpoints_dir: str | Path = "checkpoints") -> list[str]:
    """Replay into the store at ``tracking_uri`` the journals under ``checkpoints_dir`` that hold entries it may
    lack (``<experiment>/<run id>/tracking-journal.jsonl`` of runs that store holds); returns one line per journal
    that wrote something (``ReplaySummary.describe``). A store that cannot be read is left to the command."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    root = Path(checkpoints_dir)
    if not root.is_dir():
        return []
    pending = [path for path in sorted(root.glob(f"*/*/{JOURNAL_NAME}")) if not is_replayed(path, tracking_uri)]
    if not pending:
        return []
    client, lines, seen = MlflowClient(tracking_uri), [], set()
    for path in pending:
        folder = path.parent.resolve()  # a recreated run's new id links to its old id's folder: merged once
        if folder in seen:
            continue
        entries = read_journal(path)
        if still_written(entries, path) or journal_run_id(entries) not in (None, folder.name):
            continue  # a run still writing it; a folder copied aside (``recipes sync`` reports it)
        try:
            client.get_run(path.parent.name)
        except MlflowException:  # not this store's run (`recipes sync` recreates it where it belongs)
            continue
        seen.add(folder)
        summary = replay(entries, client, path.parent.name, folder=path.parent)
        mark_replayed(path, tracking_uri)
        if not summary.wrote_nothing():
            lines.append(summary.describe())
    return lines


def replay_before_reading(tracking_uri: str, checkpoints_dir: str | Path, prog: str) -> None:
    """``replay_pending`` for a command about to read the store: what it wrote is said on stderr (one line per
    run, ``prog`` first); a store that refuses the writes (read-only, a server gone) is said in one line, and the
    command goes on reading what the store holds."""
    import sys  # noqa: PLC0415

    try:
        lines = replay_pending(tracking_uri, checkpoints_dir)
    except Exception as err:  # noqa: BLE001  (the command reads the store as it is; its own errors follow)
        from recipes.tracking.failures import short_reason  # noqa: PLC0415

        print(f"{prog}: the run journals under {Path(checkpoints_dir).resolve()} were not replayed into the store "
              f"({short_reason(err)}); it may lack the last values of runs killed before they ended", file=sys.stderr)
        return
    for line in lines:
        print(f"{prog}: replayed the journal of {line}", file=sys.stderr)


__all__ = ["MARKERS_DIR", "mark_replayed", "replay_before_reading", "replay_pending"]
