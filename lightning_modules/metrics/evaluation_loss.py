"""The val and test loss as a metric: a weighted mean over the epoch's samples (or tokens), summed over DDP ranks.

Lightning's ``self.log(..., sync_dist=True)`` of a per-batch mean averages the ranks' sums and counts, and divides the
count in an integer tensor (gloo): 399 samples on 2 ranks count as 199, not 199.5. ``MeanLoss`` keeps two sums (loss x
weight, weight), which torchmetrics adds over the ranks before ``compute``: the loss of an evaluation is the same on
any number of processes. The weight of a batch is what its mean was taken over: samples, non-ignored tokens (language
models), or the summed class weights of a weighted cross entropy, so the epoch's value does not depend on how the
samples were cut into batches.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric


class MeanLoss(Metric):
    """The mean of per-batch losses weighted by what each batch's mean was taken over.

    ``update(loss, weight)`` adds ``loss * weight`` and ``weight``; ``compute`` is their ratio, after the sums of all
    DDP ranks are added. Nothing is read back to the host on ``update``.
    """

    full_state_update = False
    higher_is_better = False
    is_differentiable = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("weighted_sum", default=torch.tensor(0.0), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, loss: Tensor, weight: Tensor | float) -> None:  # type: ignore[override]
        """Add a batch's mean ``loss`` taken over ``weight`` samples (or tokens, or summed class weights)."""
        weight = torch.as_tensor(weight, dtype=self.weight.dtype, device=self.weight.device)
        weighted = loss.detach().to(self.weighted_sum.dtype) * weight
        # a batch with nothing to average (every token ignored) has a NaN mean and adds nothing
        self.weighted_sum += torch.where(weight > 0, weighted, torch.zeros_like(weighted))
        self.weight += weight

    def compute(self) -> Tensor:
        return self.weighted_sum / self.weight


__all__ = ["MeanLoss"]
