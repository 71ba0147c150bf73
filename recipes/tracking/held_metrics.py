"""Metrics held back for a few seconds and written together: the logger's side of MLflow's write cost.

Every ``log_batch`` to MLflow's SQLite store is a commit to disk, and the asynchronous path adds a queue hand-off,
a status thread and, at each flush, a restart of MLflow's worker threads (about 8 ms on 2 cores, once per checkpoint
save). A recipe logs every 10 steps and at every epoch end; with a fast loop that is many small writes a second.
``HeldMetrics`` keeps the logged (step, values) pairs in memory for up to ``hold_seconds`` and hands them to the
store as one ``log_batch`` of ``mlflow.entities.Metric`` (each with its own step and time): when the oldest value has
waited ``hold_seconds`` (queued to MLflow's asynchronous writer: the journal, fsynced at every checkpoint save, is the
write-ahead log, ``recipes.tracking.write_behind``) and at the end of the run (synchronously). The run's journal records every call at once, so nothing held is lost
to a crash that the journal does not have.
"""

from __future__ import annotations

import functools
import re
import time
from typing import Any

# the characters MLflow accepts in a metric name (Lightning's MLFlowLogger drops the others the same way)
INVALID_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")
# MLflow's limit of metrics per log_batch call
BATCH_LIMIT = 1000


@functools.lru_cache(maxsize=4096)
def _clean_name(name: str) -> str:
    """``name`` without the characters MLflow refuses (a run logs the same few names again and again)."""
    return INVALID_NAME.sub("", name)


class HeldMetrics:
    """(step, values, time) of logged metrics not written yet.

    Args:
        hold_seconds: Write once the oldest held value has waited this long (MLflow's own asynchronous buffer
            waits 5 s the same way).
    """

    def __init__(self, hold_seconds: float = 5.0) -> None:
        self.hold_seconds = hold_seconds
        self.entries: list[tuple[int, dict[str, float], int]] = []
        self.tags: dict[str, str] = {}  # run tags held the same way (the newest value of each)
        self.since: float | None = None  # time.monotonic() of the oldest entry

    def __len__(self) -> int:
        return len(self.entries) + len(self.tags)

    def add(self, values: dict[str, Any], step: int | None, timestamp: int) -> None:
        """Hold one call's values (strings are left out, as MLflow has no string metrics). ``timestamp`` (ms since the
        epoch) is the one the run's journal recorded for them: a value written twice, from here and from a replay of
        the journal, is then one row of the store (its key includes the time), not two."""
        numbers = {_clean_name(k): float(v) for k, v in values.items() if not isinstance(v, str)}
        if not numbers:
            return
        if not len(self):
            self.since = time.monotonic()
        self.entries.append((step or 0, numbers, timestamp))

    def add_tags(self, values: dict[str, str]) -> None:
        """Hold run tags (a tag set again before the write is written once, with its newest value)."""
        if values and not len(self):
            self.since = time.monotonic()
        self.tags.update(values)

    def due(self) -> bool:
        """Whether the oldest held value has waited ``hold_seconds``."""
        return self.since is not None and time.monotonic() - self.since >= self.hold_seconds

    def take(self) -> list[tuple[list[Any], list[Any]]]:
        """Everything held, as ``log_batch`` arguments ``(metrics, tags)``: ``mlflow.entities.Metric`` lists of at
        most ``BATCH_LIMIT``, the ``RunTag`` s with the first; and forget it."""
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(key=k, value=v, timestamp=t, step=step) for step, values, t in self.entries
                   for k, v in values.items()]
        tags = [RunTag(k, v) for k, v in self.tags.items()]
        self.entries, self.tags, self.since = [], {}, None
        batches = [metrics[i:i + BATCH_LIMIT] for i in range(0, len(metrics), BATCH_LIMIT)] or ([[]] if tags else [])
        return [(batch, tags if i == 0 else []) for i, batch in enumerate(batches)]


__all__ = ["BATCH_LIMIT", "HeldMetrics", "INVALID_NAME"]
