"""A Trainer profiler that records nothing and costs nothing per call: Lightning's default, without its overhead.

Lightning wraps every hook it calls (each callback's, the module's, the strategy's), the training batch and the
epoch in ``with trainer.profiler.profile(action_name):``. Its default profiler, ``PassThroughProfiler``, records
nothing, but its ``profile`` is a ``@contextmanager`` generator: each use builds a generator and a context-manager
object and runs the generator twice to call the empty ``start`` and ``stop``, eight Python frames, about 2.4 us on a
CPU (three and 0.34 us with ``NoOpProfiler``; ``benchmarks/README.md``). Bare Lightning enters about 31 such contexts per
training step, so a small network's step pays some 70 us for a profiler that was never asked for.

``NoOpProfiler`` is a ``PassThroughProfiler`` (so everything that treats the default profiler specially still does)
whose ``profile`` returns one shared context manager with empty ``__enter__``/``__exit__``. Recipes use it whenever
the config names no profiler; pass it to a plain ``lightning.Trainer(profiler=NoOpProfiler())`` for the same saving.
A profiler the user chooses (``simple``, ``advanced``, ``pytorch``, an instance) is used as given; a ``barebones``
Trainer, which refuses every profiler, gets none.
"""

from __future__ import annotations

from types import TracebackType

from lightning.pytorch.profilers import PassThroughProfiler


class _NothingToProfile:
    """A context manager that does nothing on entry or exit (one instance serves every call)."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        return None  # never swallows an exception


NOTHING_TO_PROFILE = _NothingToProfile()


class NoOpProfiler(PassThroughProfiler):
    """Lightning's ``PassThroughProfiler`` (records nothing, the Trainer's default) with a ``profile`` context that
    costs a fraction of a microsecond instead of about 2.4 us: the Trainer enters one around every hook call."""

    def profile(self, action_name: str) -> _NothingToProfile:  # type: ignore[override]
        """A context manager that records nothing (the same object for every ``action_name``)."""
        return NOTHING_TO_PROFILE


__all__ = ["NOTHING_TO_PROFILE", "NoOpProfiler"]
