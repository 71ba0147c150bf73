"""``kept_signature``: a step method whose signature is built once, not at every batch Lightning runs."""

from __future__ import annotations

import inspect
from typing import Any, Callable, TypeVar

StepMethod = TypeVar("StepMethod", bound=Callable[..., Any])


def kept_signature(method: StepMethod) -> StepMethod:
    """Store ``method``'s signature on it as ``__signature__``, which ``inspect.signature`` and
    ``inspect.getfullargspec`` return as they find it (PEP 362) instead of building it from the code object.

    Lightning reads the signature of ``training_step`` at every training batch, and of ``validation_step``,
    ``test_step`` and ``predict_step`` at every batch of theirs, to decide whether to pass ``batch_idx``: 19 us a batch
    on a 2-core EPYC (about 1% of a spiral MLP's CPU step), 5.5 us with the signature kept. A subclass that overrides
    the method gets its own signature read as usual. Returns ``method``.
    """
    method.__signature__ = inspect.signature(method)  # type: ignore[attr-defined]
    return method


__all__ = ["kept_signature"]
