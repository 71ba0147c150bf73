"""What a task's ``forward_batch`` returns, and how the loop doctor words a task's expected first loss."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor


@dataclass
class StepOutput:
    """What a task's ``forward_batch`` returns for one batch.

    ``loss_weight`` is what ``loss`` is the mean over, when that is not ``batch_size`` samples: the non-ignored tokens
    of a language model, the summed class weights of a weighted cross entropy (a tensor, left on the device). The
    val and test loss weight each batch by it, so the epoch's loss does not depend on how samples were batched.
    """

    loss: Tensor
    outputs: Tensor
    targets: Tensor
    batch_size: int
    loss_weight: Tensor | float | None = None


def initial_loss_wording(expected: float, outcomes: int | None = None, what: str = "classes") -> str:
    """How the loop doctor's initial-loss message words an expected loss.

    "ln(10) = 2.303 expected at initialization for 10 classes" when ``expected`` is ln(``outcomes``), the cross
    entropy of a uniform guess over that many ``what``; "2.303 expected at initialization" otherwise.
    """
    if outcomes is not None and outcomes >= 1 and math.isclose(expected, math.log(outcomes)):
        return f"ln({outcomes}) = {expected:.3f} expected at initialization for {outcomes} {what}"
    return f"{expected:.3f} expected at initialization"


__all__ = ["StepOutput", "initial_loss_wording"]
