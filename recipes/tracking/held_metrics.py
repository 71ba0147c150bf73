"""Metrics held back for a few seconds and written together: the logger's side of MLflow's write cost.

Every ``log_batch`` to MLflow's SQLite store is a commit to disk, and the asynchronous path adds a queue hand-off,
a status thread and, at each flush, a restart of MLflow's worker threads (about 8 ms on 2 cores, once per checkpoint
save). A recipe logs every 10 steps and at every epoch end; with a fast loop that is many small writes a second.
``HeldMetrics`` keeps the logged (step, values) pairs in memory for up to ``hold_seconds`` and hands them to the
store as one ``log_batch`` of ``mlflow.entities.Metric`` (each with its own step and time): at a checkpoint save
(queued to MLflow's asynchronous writer: the fsynced journal is the write-ahead log, ``recipes.tracking.write_behind``),
when the oldest value has waited ``hold_seconds`` (asynchronously), and at the end of the run (synchronously). The run's journal records every call at once, so nothing held is lost
to a crash that the journal does not have.
"""

from __future__ import annotations

import re
import time
from typing import Any

# the characters MLflow accepts in a metric name (Lightning's MLFlowLogger drops the others the same way)
INVALID_NAME = re.compile(r"[^a-zA-Z0-9_/. -]+")
# MLflow's limit of metrics per log_batch call
BATCH_LIMIT = 1000


class HeldMetrics:
    """(step, values, time) of logged metrics not written yet.

    Args:
        hold_seconds: Write once the oldest held value has waited this long (MLflow's own asynchronous buffer
            waits 5 s the same way).
    """

    def __init__(self, hold_seconds: float = 5.0) -> None:
        self.hold_seconds = hold_seconds
        self.entries: list[tuple[int, dict[str, float], int]] = []
        self.since: float | None = None  # time.monotonic() of the oldest entry

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, values: dict[str, Any], step: int | None) -> None:
        """Hold one call's values (strings are left out, as MLflow has no string metrics)."""
        numbers = {INVALID_NAME.sub("", k): float(v) for k, v in values.items() if not isinstance(v, str)}
        if not numbers:
            return
        if not self.entries:
            self.since = time.monotonic()
        self.entries.append((step or 0, numbers, int(time.time() * 1000)))

    def due(self) -> bool:
        """Whether the oldest held value has waited ``hold_seconds``."""
        return self.since is not None and time.monotonic() - self.since >= self.hold_seconds

    def take(self) -> list[list[Any]]:
        """Everything held, as ``mlflow.entities.Metric`` lists of at most ``BATCH_LIMIT``, and forget it."""
        from mlflow.entities import Metric

        metrics = [Metric(key=k, value=v, timestamp=t, step=step) for step, values, t in self.entries
                   for k, v in values.items()]
        self.entries, self.since = [], None
        return [metrics[i:i + BATCH_LIMIT] for i in range(0, len(metrics), BATCH_LIMIT)]


__all__ = ["BATCH_LIMIT", "HeldMetrics", "INVALID_NAME"]
