"""A run's record kept next to its checkpoints, so a tracking store that fails mid-run costs nothing.

``RecipeLogger`` appends every metric step, param, tag and the final status of a tracked fit to
``<checkpoints_dir>/<experiment>/<run id>/tracking-journal.jsonl`` (one JSON object per line) as it sends them to
MLflow. When the store stops accepting writes (read-only, deleted, locked beyond its timeout, a server gone), training
goes on with one warning, and the journal still holds everything. ``replay`` merges the journal into the store and
never writes over newer state (every entry is timed; see ``replay`` for the rules): metric steps the store lacks,
params and tags it lacks, a tag or the final status only when the journal's is newer than the store's last change (a
run resumed and ended in another directory, a trial the sweep pruned after its fit ended keep theirs). ``recipes
sync`` replays every journal under a checkpoints folder, and a resumed fit replays its run's journal before it
continues. Replaying twice changes nothing.
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

from recipes.tracking.abandoned_runs import ABANDONED_TAG, HOST_TAG, PID_TAG, mark_abandoned, process_exists
from recipes.tracking.end_of_run import replay_end_of_run
from recipes.tracking.write_behind import INVALID_NAME
from recipes.tracking.journal_lines import read_entries

JOURNAL_NAME = "tracking-journal.jsonl"
# one encoder for every entry (``json.dumps(..., default=str)`` builds a new one per call)
_ENCODER = json.JSONEncoder(default=str)
ATTEMPT_UNENDED = (
    "the attempt that started at {start} (process {pid} on {host}) ended without closing the run (kill -9, out of "
    "memory, power loss); marked KILLED by a replay of its journal. `--ckpt_path last` resumes it from its last "
    "checkpoint, if any."
)


class TrackingJournal:
    """Append-only JSON lines of one run's record (opened on first write, flushed at every write).

    Args:
        path: The journal file (its folder is created when needed).
        run_id: The run it records, written in every "start" entry (``recipes sync`` replays a copied folder's
            journal into that run, never into one named after the folder).
    """

    def __init__(self, path: Path, run_id: str | None = None) -> None:
        self.path, self.run_id = path, run_id
        self._handle: Any = None
        self._started = False  # this attempt's "start" entry is written
        self._unsynced = False  # entries written since the last fsync (best and last are saved back to back)
        self._syncer: Any = None  # the worker thread of sync_to_disk(wait=False), started on its first use
        self._pending_sync: Any = None  # that fsync's future, until someone waited for it

    def record(self, kind: str, **data: Any) -> None:
        """Append one entry: ``kind`` is "metrics" (``step``, ``values``), "params", "tags", "text" (``name``,
        ``text``: a text artifact such as ``config.yaml``) or "status". Every entry carries ``time`` (ms since the
        epoch: now, unless ``data`` gives one), which a replay compares with the store's newest state. The first entry
        this process writes is preceded by a "start" entry (``time``, ``host``, ``pid``): one per attempt."""
        if self._handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            cut = ends_mid_line(self.path)
            self._handle = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run
            if cut:  # a kill cut the last line: end it, or this attempt's first entry would join it and be lost
                self._handle.write("\n")
            if not self._started:  # once per attempt, also when a write after the run's end reopens the file
                self._started = True
                start = {"time": int(time.time() * 1000), "host": socket.gethostname(), "pid": os.getpid(),
                         **({"run_id": self.run_id} if self.run_id else {})}
                self._handle.write(json.dumps({"kind": "start", **start}) + "\n")
        entry = {"kind": kind, "time": int(time.time() * 1000), **data}  # every entry is timed (a replay's merge)
        self._handle.write(_ENCODER.encode(entry) + "\n")
        self._handle.flush()
        self._unsynced = True

    def sync_to_disk(self, wait: bool = True) -> None:
        """fsync what was written; nothing written since the last fsync: no call (0.5-3 ms, more on a busy disk).

        Every entry is flushed to the operating system as it is written, so a killed process (``kill -9``, out of
        memory) loses nothing of it: the fsync only guards against the machine itself going down. With ``wait=False``
        (a checkpoint save) the fsync runs on a worker thread (``os.fsync`` releases the GIL) and the training thread
        goes on at once; ``close`` and the next waiting call wait for it."""
        if self._handle is None or not self._unsynced:
            return
        self._unsynced = False
        if wait:
            self._wait_for_sync()
            os.fsync(self._handle.fileno())
            return
        if self._syncer is None:
            from concurrent.futures import ThreadPoolExecutor

            self._syncer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loopwise-journal-fsync")
        self._wait_for_sync()  # at most one in flight (saves are seconds apart; best and last back to back)
        self._pending_sync = self._syncer.submit(os.fsync, self._handle.fileno())

    def _wait_for_sync(self) -> None:
        pending, self._pending_sync = self._pending_sync, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for an fsync in flight, stop its worker and close the file (closed even when that fsync failed; its
        error is raised then)."""
        try:
            self._wait_for_sync()
        finally:
            if self._syncer is not None:
                self._syncer.shutdown(wait=True)
                self._syncer = None
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
    """The entries of a journal; a line cut by a kill is skipped, a damaged line (not UTF-8, not JSON, not an entry)
    skipped with one warning naming the file and line (``journal_lines.read_entries``)."""
    return read_entries(path)


def journal_run_id(entries: list[dict[str, Any]]) -> str | None:
    """The run a journal's entries name (its last "start" entry's ``run_id``; ``None`` in journals older than it)."""
    named = [e.get("run_id") for e in entries if e.get("kind") == "start" and isinstance(e.get("run_id"), str)]
    return named[-1] if named else None


def clock(ms: int) -> str:
    """A time in ms since the epoch as local ``YYYY-MM-DD HH:MM:SS`` (the report's times)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


@dataclass
class ReplaySummary:
    """What ``replay`` wrote into a run, and what it left as the store holds it (and why)."""

    run_id: str
    metric_values: int = 0
    params: int = 0
    tags: int = 0
    status: str | None = None
    texts: int = 0  # artifacts: the journal's texts (config.yaml), the figures and model the end of the run kept
    metric_values_held: int = 0  # the journal's (key, step) values the store already held: never written again
    params_kept: int = 0  # held by the store with another value (MLflow params never change)
    tags_kept: int = 0  # held by the store with another value set after the journal's entry
    status_kept: str | None = None  # the store's status and why the journal's was not written
    continued_elsewhere: bool = False  # the store holds values logged after this journal's last entry

    def wrote_nothing(self) -> bool:
        """Whether the replay left the store as it was."""
        return not (self.metric_values or self.params or self.tags or self.status or self.texts)

    def describe(self) -> str:
        counts = f"{self.metric_values} metric value(s), {self.params} param(s), {self.tags} tag(s)"
        texts = f", {self.texts} artifact(s)" if self.texts else ""
        status = f", status {self.status}" if self.status else ""
        if self.wrote_nothing():
            line = f"run {self.run_id}: nothing written ({counts})"
        else:
            line = f"run {self.run_id}: wrote {counts}{texts}{status}"
        kept = [f"status kept {self.status_kept}"] if self.status_kept else []
        if self.tags_kept:
            kept.append(f"{self.tags_kept} tag(s) kept (newer in the store)")
        if self.params_kept:
            kept.append(f"{self.params_kept} param(s) kept (the store's value; MLflow params never change)")
        if self.metric_values_held:
            kept.append(f"{self.metric_values_held} metric value(s) already held")
        return line + ("; " + ", ".join(kept) if kept else "")


@dataclass
class JournalRecord:
    """A journal's entries as a replay merges them: each value with the time (ms) its entry was written (``None``
    for params and tags of journals written before entries were timed: older than anything in the store)."""

    metrics: dict[tuple[str, int], tuple[float, int]]  # (key, step) -> (value, time): the first value of a step
    params: dict[str, str]  # the first value of each (the one MLflow keeps)
    tags: dict[str, tuple[str, int | None]]  # the last value of each (loopwise.checkpoint_step changes)
    texts: dict[str, str]
    status: dict[str, Any] | None  # the last "status" entry after the last "start"
    end_of_run: list[dict[str, Any]]  # "artifact" and "model" entries: what the end wrote beside a store that was down
    attempt: dict[str, Any] | None  # the last "start" entry, if the journal records them
    last_time: int  # the newest time of any entry

    @classmethod
    def of(cls, entries: list[dict[str, Any]], origin: str | None, run_id: str) -> JournalRecord:
        """Merge ``entries``; tag values naming ``origin`` (a recreated run's old id) name ``run_id`` instead."""
        record = cls({}, {}, {}, {}, None, [], None, 0)
        for entry in entries:
            kind, at = entry.get("kind"), entry.get("time")
            record.last_time = max(record.last_time, int(at or 0))
            if kind == "start":
                record.attempt, record.status = entry, None  # only a status written after the last start ends the run
            elif kind == "text":
                record.texts[str(entry.get("name"))] = str(entry.get("text", ""))
            elif kind == "metrics":
                step = int(entry.get("step") or 0)
                for key, value in entry.get("values", {}).items():
                    if isinstance(value, (int, float)):  # as WriteBehind: no string metrics, MLflow's name rules
                        record.metrics.setdefault((INVALID_NAME.sub("", key), step), (float(value), int(at or 0)))
            elif kind == "params":
                for key, value in entry.get("values", {}).items():
                    record.params.setdefault(key, str(value))
            elif kind == "tags":
                for key, value in entry.get("values", {}).items():
                    text = str(value).replace(origin, run_id) if origin else str(value)
                    record.tags[key] = (text, int(at) if at is not None else None)
            elif kind == "status":
                record.status = entry
            elif kind in ("artifact", "model"):
                record.end_of_run.append(entry)
        return record


@dataclass
class StoreRecord:
    """What the store holds of a run before a replay, and the newest time it changed by others than this journal:
    its ``end_time`` (a status set: FINISHED, KILLED by pruning, FAILED; kept by a reopen to RUNNING) and the newest
    timestamp of a metric value the journal does not hold (a resume elsewhere logged it). ``system/*`` metrics do not
    count: MLflow's sampler writes them beside the journal, not instead of it."""

    steps: dict[str, set[int]]
    elsewhere: int  # the newest time of a metric value this journal lacks (0: none)
    changed_at: int  # max(end_time, elsewhere)

    @classmethod
    def of(cls, client: Any, run: Any, journal: JournalRecord) -> StoreRecord:
        steps, elsewhere = {}, 0
        journal_steps: dict[str, set[int]] = {}
        for key, step in journal.metrics:
            journal_steps.setdefault(key, set()).add(step)
        for key in run.data.metrics:
            history = client.get_metric_history(run.info.run_id, key)
            steps[key] = {m.step for m in history}
            if not key.startswith("system/"):
                lacked = [m.timestamp for m in history if m.step not in journal_steps.get(key, ())]
                elsewhere = max([elsewhere, *lacked])
        return cls(steps, elsewhere, max(int(run.info.end_time or 0), elsewhere))


def replay(entries: list[dict[str, Any]], client: Any, run_id: str, origin: str | None = None,
           folder: Path | None = None) -> ReplaySummary:
    """Merge the journal ``entries`` into run ``run_id``: never over state the store got later (``StoreRecord``).

    * a metric value at a (key, step) the store holds is never written again;
    * a param the store lacks is written (a held one never changes, as in MLflow);
    * a tag the store lacks is written; a held one with another value only when the journal's entry is newer than
      the store's last change (an entry without a time, from an older journal, never);
    * the status (the last attempt's, or KILLED for one that never ended and whose process is gone) only when it is
      newer than the store's last change: a FINISHED, KILLED (pruned) or FAILED set later elsewhere stays, a RUNNING
      run the journal ended is ended, one continued elsewhere after the journal's end is left running. A KILLED that a
      later command guessed for this attempt's process (``loopwise.abandoned``) yields to the status it wrote.

    ``origin``: the id the journal's run had when the run was recreated under ``run_id`` (tag values naming it name
    ``run_id`` instead). ``folder``: the run's folder, which holds what the end of the run kept while the store was
    down (a figure, the MLflow model: ``end_of_run.replay_end_of_run``), written after the metrics."""
    from mlflow.entities import Metric, RunTag  # noqa: PLC0415

    summary = ReplaySummary(run_id)
    run = client.get_run(run_id)
    journal = JournalRecord.of(entries, origin, run_id)
    store = StoreRecord.of(client, run, journal)
    summary.continued_elsewhere = store.elsewhere > journal.last_time
    held_params, held_tags = dict(run.data.params), dict(run.data.tags)
    for key, value in journal.params.items():
        if key not in held_params:
            client.log_param(run_id, key, value)
            summary.params += 1
        elif held_params[key] != value:
            summary.params_kept += 1
    tags = []
    for key, (value, at) in journal.tags.items():
        if held_tags.get(key) == value:
            continue
        if key in held_tags and (at is None or at <= store.changed_at):
            summary.tags_kept += 1
            continue
        tags.append(RunTag(key, value))
    # one batch: two commands replaying the same journal at once (workers of a sweep starting together) may insert a
    # tag together; MLflow's set_tag fails the loser, its log_batch tries again
    if tags:
        client.log_batch(run_id, tags=tags, synchronous=True)
    summary.tags += len(tags)
    missing = [Metric(key, value, at, step) for (key, step), (value, at) in journal.metrics.items()
               if step not in store.steps.get(key, ())]
    for start in range(0, len(missing), 1000):
        client.log_batch(run_id, metrics=missing[start : start + 1000], synchronous=True)
    summary.metric_values = len(missing)
    summary.metric_values_held = len(journal.metrics) - len(missing)
    summary.texts = replay_texts(journal.texts, client, run_id)
    summary.texts += replay_end_of_run(journal.end_of_run, client, run_id, folder)
    replay_status(journal, store, run, client, summary)
    return summary


def replay_status(journal: JournalRecord, store: StoreRecord, run: Any, client: Any, summary: ReplaySummary) -> None:
    """Write the journal's status into the run unless the store's is newer (``replay``'s rule)."""
    status, attempt, tags = journal.status, journal.attempt, run.data.tags
    inferred = status is None and attempt is not None and not attempt_alive(attempt)
    if inferred:
        status = {"status": "KILLED", "time": journal.last_time}
    if status is None or run.info.status == status.get("status"):
        return
    wanted, at = str(status.get("status")), int(status.get("time") or 0)
    # a later command marked this attempt KILLED because its process was gone (and nobody wrote the run since: the
    # run's process tags still name it): the journal knows how it ended
    pid, host = (str(attempt.get("pid")), str(attempt.get("host"))) if attempt else ("", "")
    guessed = (attempt is not None and (tags.get(PID_TAG), tags.get(HOST_TAG)) == (pid, host)
               and f"process {pid} on {host} ended" in tags.get(ABANDONED_TAG, ""))
    if at <= store.changed_at and not (guessed and not inferred):
        if store.elsewhere >= store.changed_at and store.elsewhere > 0:
            when = f"it holds values logged at {clock(store.elsewhere)}"
        else:
            when = f"set {clock(int(run.info.end_time or 0))}"
        summary.status_kept = (f"{run.info.status} (the store's, {when}, is newer than the journal's {wanted} at "
                               f"{clock(at)})")
        return
    if inferred:
        start = clock(int(attempt.get("time") or 0))  # type: ignore[union-attr]
        reason = ATTEMPT_UNENDED.format(start=start, pid=pid, host=host)
        if tags.get(ABANDONED_TAG) != reason:
            mark_abandoned(client, run.info.run_id, reason)
            summary.tags += 1
    elif guessed:  # the guess was wrong: the process closed its run, the store just did not hear it
        client.delete_tag(run.info.run_id, ABANDONED_TAG)
        summary.tags += 1
    client.set_terminated(run.info.run_id, wanted, at or int(time.time() * 1000))
    summary.status = wanted


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
    "ReplaySummary",
    "TrackingJournal",
    "journal_run_id",
    "read_journal",
    "replay",
]
