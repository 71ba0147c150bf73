"""What a task's ``forward_batch`` returns, and how the loop doctor words a task's expected first loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass
class StepOutput:
    """What a task's ``forward_batch`` returns for one batch."""

    loss: Tensor
    outputs: Tensor
    targets: Tensor
    batch_size: int


def initial_loss_wording(expected: float, outcomes: int | None = None, what: str = "classes") -> str:
    """How the loop doctor's initial-loss message words an expected loss.

    "ln(10) = 2.303 expected at initialization for 10 classes" when ``expected`` is ln(``outcomes``), the cross
    entropy of a uniform guess over that many ``what``; "2.303 expected at initialization" otherwise.
    """
    if outcomes is not None and outcomes >= 1 and math.isclose(expected, math.log(outcomes)):
        return f"ln({outcomes}) = {expected:.3f} expected at initialization for {outcomes} {what}"
    return f"{expected:.3f} expected at initialization"


__all__ = ["StepOutput", "initial_loss_wording"]
