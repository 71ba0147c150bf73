"""A tracking server that comes back during the run: the run's journal written into it by itself, no `recipes sync`.

When a tracking server stops answering, ``RecipeLogger`` warns once and writes only to the run's journal (no call of
the training thread waits on the server again). ``ServerCatchUp`` then asks the server, from a background thread, for
the run at most every ``CATCH_UP_PROBE_S`` seconds (one ``get_run``, bounded by the recipe's HTTP settings:
``recipes.tracking.failures``). Once it answers:

1. the journal as it stands is replayed into the run (``recipes.tracking.journal.replay``: only what the run lacks;
   the logger's writer sends nothing while the store has failed, and a value it sent before the outage carries the
   journal's time, so it is one row of the store whichever write lands);
2. the logger switches back to writing to the server (``resume``: under its lock, so that every metric value is
   either in the journal read at that moment or written directly after it, never both and never neither);
3. the journal up to that moment is replayed again (the few values recorded during step 1; replay never writes a
   metric step the run holds);

and one line says so. The logger's ``finalize`` tries the same once more, synchronously, when the server has not
answered by the end of the run; only a run that ends while its server is away needs `recipes sync`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.tracking.database_urls import masked_url
from recipes.tracking.journal import read_journal, replay

CATCH_UP_PROBE_S = 5.0  # the least seconds between two probes of a server that went away
STOP_WAIT_S = 30.0  # how long ``stop`` waits for a catch-up in progress (its calls are bounded by the HTTP timeout)


@dataclass
class CatchUpResult:
    """What a catch-up wrote into the run from the journal, and how long the server was away."""

    metric_values: int = 0
    params: int = 0
    tags: int = 0
    away_s: float = 0.0

    def add(self, summary: Any) -> None:
        """Count one ``ReplaySummary``."""
        self.metric_values += summary.metric_values
        self.params += summary.params
        self.tags += summary.tags


def caught_up_message(uri: str, result: CatchUpResult) -> str:
    """The one line printed when the server answers again and the run's record is complete there."""
    return (
        f"recipes: the tracking server at {masked_url(uri)} answers again (away for {result.away_s:.0f} s): wrote the "
        f"{result.metric_values} metric value(s), {result.params} param(s) and {result.tags} tag(s) of the outage "
        "from the run's journal; training goes on writing to the server"
    )


class ServerCatchUp:
    """Catches a run up with its tracking server once the server answers again.

    Args:
        client: A function returning the MLflow client of the run (the logger's ``experiment``).
        run_id: The run.
        journal: The run's journal file.
        uri: The server (named in the line printed once the run has caught up: ``caught_up_message``).
        resume: The logger's switch back to the server: called once the journal has been replayed; returns the
            journal's entries at the moment of the switch (read under the logger's lock).
        on_failed: Called with the error when the server fails again right after the switch back (the logger's
            ``store_failed``: a new outage).
        interval_s: The least seconds between two probes.
    """

    def __init__(
        self,
        client: Callable[[], Any],
        run_id: str,
        journal: Path,
        uri: str,
        resume: Callable[[], list[dict[str, Any]]],
        on_failed: Callable[[BaseException], None],
        interval_s: float = CATCH_UP_PROBE_S,
    ) -> None:
        self.client, self.run_id, self.journal, self.uri = client, run_id, Path(journal), uri
        self.resume, self.on_failed, self.interval_s = resume, on_failed, interval_s
        self._since = time.monotonic()  # when the server stopped answering
        self._pending = False  # the server stopped answering and the run has not caught up since
        self._finished = False  # the run ended: no more probing
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = threading.Lock()  # _pending, _finished, _thread
        self._attempt = threading.Lock()  # one catch-up at a time (the thread's, or finish's)

    def start(self) -> None:
        """The server just stopped answering: probe it from a background thread until the run has caught up (one
        thread at a time; none once the run has ended: ``finish``)."""
        with self._state:
            if not self._pending:
                self._pending, self._since = True, time.monotonic()
            if self._finished or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._probe_until_back, name="recipes-catch-up", daemon=True)
            self._thread.start()

    def finish(self) -> None:
        """The run ends: stop probing (a catch-up in progress is waited for) and, if the run has not caught up yet,
        try once more now, so that a server back by now gets the whole record without `recipes sync`."""
        with self._state:
            self._finished, thread = True, self._thread
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(STOP_WAIT_S)
        if self._pending:
            self.try_now()

    def _probe_until_back(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.try_now()
            with self._state:
                if not self._pending:  # caught up (a new outage sets it again, and this thread goes on)
                    self._thread = None
                    return

    def try_now(self) -> bool:
        """Probe the server once and, if it answers, catch the run up; whether the run is caught up. A server that
        does not answer (or fails during the catch-up) leaves the logger writing to the journal only."""
        with self._attempt:
            if not self._pending:
                return True
            result = CatchUpResult(away_s=time.monotonic() - self._since)
            try:
                client = self.client()
                client.get_run(self.run_id)  # the probe: one cheap read, bounded by the HTTP timeout
                result.add(replay(read_journal(self.journal), client, self.run_id, folder=self.journal.parent))
            except Exception:  # noqa: BLE001  (still away: the journal keeps everything)
                return False
            with self._state:
                self._pending = False  # before the switch: a failure after it is a new outage (``start``)
            entries = self.resume()  # from here on the logger writes to the server again
            try:
                result.add(replay(entries, client, self.run_id))  # what was recorded while step 1 ran
            except Exception as err:  # noqa: BLE001  (away again: the logger's failure path, a new outage)
                self.on_failed(err)
                return False
        print(caught_up_message(self.uri, result), file=sys.stderr, flush=True)  # a notice: stdout is the run's
        return True

__all__ = ["CATCH_UP_PROBE_S", "CatchUpResult", "ServerCatchUp", "caught_up_message"]
