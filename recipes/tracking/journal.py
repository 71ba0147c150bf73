"""A run's record kept next to its checkpoints, so a tracking store that fails mid-run costs nothing.

``RecipeLogger`` appends every metric step, param, tag and the final status of a tracked fit to
``<checkpoints_dir>/<experiment>/<run id>/tracking-journal.jsonl`` (one JSON object per line) as it sends them to
MLflow. When the store stops accepting writes (read-only, deleted, locked beyond its timeout, a server gone), training
goes on with one warning, and the journal still holds everything. ``replay`` writes into the store what it lacks
(metric steps it does not hold, params, tags, the final status); ``recipes sync`` replays every journal under a
checkpoints folder, and a resumed fit replays its run's journal before it continues. Replaying twice changes nothing.
MLflow's asynchronous logging reports each refused write with a traceback; ``tracking_failures.watch_store_failures``
turns them into the logger's one warning.

Each process that writes a run (each attempt: the first start, every resume) opens its part of the journal with a
"start" entry (time, host, process id). The status of the last attempt decides the run's status on a replay: an
attempt with no "status" entry after its start never ended (a kill -9, a power loss), and unless its process still
runs on this host the run is ended KILLED, never FINISHED by an earlier attempt's status.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.tracking.abandoned_runs import ABANDONED_TAG, process_exists

JOURNAL_NAME = "tracking-journal.jsonl"
ATTEMPT_UNENDED = (
    "the attempt that started at {start} (process {pid} on {host}) ended without closing the run (kill -9, out of "
    "memory, power loss); marked KILLED by a replay of its journal. `--ckpt_path last` resumes it from its last "
    "checkpoint, if any."
)


class TrackingJournal:
    """Append-only JSON lines of one run's record (opened on first write, flushed at every write).

    Args:
        path: The journal file (its folder is created when needed).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: Any = None
        self._started = False  # this attempt's "start" entry is written

    def record(self, kind: str, **data: Any) -> None:
        """Append one entry: ``kind`` is "metrics" (``step``, ``time`` in ms, ``values``), "params", "tags",
        "text" (``name``, ``text``: a text artifact such as ``config.yaml``) or "status". The first entry this
        process writes is preceded by a "start" entry (``time``, ``host``, ``pid``): one per attempt."""
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cut = ends_mid_line(self.path)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
            if cut:  # a kill cut the last line: end it, or this attempt's first entry would join it and be lost
                self._handle.write("\n")
            if not self._started:  # once per attempt, also when a write after the run's end reopens the file
                self._started = True
                start = {"time": int(time.time() * 1000), "host": socket.gethostname(), "pid": os.getpid()}
                self._handle.write(json.dumps({"kind": "start", **start}) + "\n")
        self._handle.write(json.dumps({"kind": kind, **data}, default=str) + "\n")
        self._handle.flush()

    def sync_to_disk(self) -> None:
        """fsync what was written (at every checkpoint save: the journal is never behind the checkpoint)."""
        if self._handle is not None:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def ends_mid_line(path: Path) -> bool:
    """Whether the file at ``path`` exists and its last line has no end (a kill during an append)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return False
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"
    except FileNotFoundError:
        return False


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The entries of a journal; a last line cut by a kill is skipped."""
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


@dataclass
class ReplaySummary:
    """What ``replay`` wrote."""

    run_id: str
    metric_values: int = 0
    params: int = 0
    tags: int = 0
    status: str | None = None
    texts: int = 0

    def describe(self) -> str:
        status = f", status {self.status}" if self.status else ""
        texts = f", {self.texts} text artifact(s)" if self.texts else ""
        return (
            f"run {self.run_id}: {self.metric_values} metric value(s), {self.params} param(s), {self.tags} tag(s)"
            f"{texts}{status}"
        )


def replay(entries: list[dict[str, Any]], client: Any, run_id: str, origin: str | None = None) -> ReplaySummary:
    """Write into run ``run_id`` what the journal ``entries`` hold and the store does not. ``origin``: the id the
    journal's run had when the run was recreated under ``run_id`` (tag values naming it name ``run_id`` instead)."""
    from mlflow.entities import Metric  # noqa: PLC0415

    summary = ReplaySummary(run_id)
    run = client.get_run(run_id)
    held_params, held_tags = dict(run.data.params), dict(run.data.tags)
    steps: dict[str, set[int]] = {}
    missing: list[Any] = []
    status: dict[str, Any] | None = None
    attempt: dict[str, Any] | None = None  # the "start" entry of the last attempt, if the journal records them
    texts: dict[str, str] = {}
    tags: dict[str, str] = {}
    for entry in entries:
        kind = entry.get("kind")
        if kind == "start":
            attempt, status = entry, None  # only a status written after the last start ends the run
        elif kind == "text":
            texts[str(entry.get("name"))] = str(entry.get("text", ""))
        elif kind == "metrics":
            for key, value in entry.get("values", {}).items():
                if key not in steps:
                    steps[key] = {m.step for m in client.get_metric_history(run_id, key)} if key in run.data.metrics else set()
                step = int(entry.get("step") or 0)
                if step not in steps[key]:
                    steps[key].add(step)
                    missing.append(Metric(key, float(value), int(entry.get("time") or 0), step))
        elif kind == "params":
            for key, value in entry.get("values", {}).items():
                if key not in held_params:
                    client.log_param(run_id, key, value)
                    held_params[key] = str(value)
                    summary.params += 1
        elif kind == "tags":  # the last value of each tag is the run's (loopwise.checkpoint_step changes)
            for key, value in entry.get("values", {}).items():
                tags[key] = str(value).replace(origin, run_id) if origin else str(value)
        elif kind == "status":
            status = entry
    for key, value in tags.items():
        if held_tags.get(key) != value:
            client.set_tag(run_id, key, value)
            held_tags[key] = value
            summary.tags += 1
    for start in range(0, len(missing), 1000):
        client.log_batch(run_id, metrics=missing[start : start + 1000], synchronous=True)
    summary.metric_values = len(missing)
    summary.texts = replay_texts(texts, client, run_id)
    if status is None and attempt is not None and not attempt_alive(attempt):
        status = {"status": "KILLED", "time": max(int(e.get("time") or 0) for e in entries)}
        start = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(attempt.get("time") or 0) / 1000))
        reason = ATTEMPT_UNENDED.format(start=start, pid=attempt.get("pid"), host=attempt.get("host"))
        if held_tags.get(ABANDONED_TAG) != reason:
            client.set_tag(run_id, ABANDONED_TAG, reason)
            summary.tags += 1
    if status is not None and client.get_run(run_id).info.status != status.get("status"):
        client.set_terminated(run_id, status.get("status"), int(status.get("time") or time.time() * 1000))
        summary.status = status.get("status")
    return summary


def attempt_alive(attempt: dict[str, Any]) -> bool:
    """Whether the process of an attempt's "start" entry still runs (on this host; another host's is taken as
    running: it cannot be checked from here, and leaving a run RUNNING is the safe mistake)."""
    if attempt.get("host") != socket.gethostname():
        return True
    pid = int(attempt.get("pid") or 0)
    return pid == os.getpid() or process_exists(pid)


def replay_texts(texts: dict[str, str], client: Any, run_id: str) -> int:
    """Log the journal's text artifacts (``config.yaml``) that run ``run_id`` lacks; how many were logged."""
    if not texts:
        return 0
    held = {a.path for a in client.list_artifacts(run_id)}
    logged = 0
    for name, text in texts.items():
        if name not in held:
            client.log_text(run_id, text, name)
            logged += 1
    return logged


__all__ = [
    "JOURNAL_NAME",
    "TrackingJournal",
    "read_journal",
    "replay",
]
