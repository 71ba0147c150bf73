"""Networks that return k ensemble members' outputs (``TabM``): the rows the training loss sees, and the ensemble.

A network may return ``(batch, k, width)`` where a task expects ``(batch, width)``. The task trains every member on
the batch (its loss is the mean of the members' losses: the loss module gets the ``(batch * k, width)`` outputs and
each target repeated k times) and evaluates and predicts with the ensemble: the mean probability (classification,
turned back into logits here) or the mean prediction (regression).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import functional as F

#: the members' dimension of a network's ``(batch, k, width)`` outputs
MEMBERS_DIM = 1


def member_rows(outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The members' outputs ``(batch, k, ...)`` as ``(batch * k, ...)`` rows (sample b's members in rows
    b*k .. b*k+k-1), and ``targets`` ``(batch, ...)`` with each sample's target repeated k times to match: a loss
    that is a mean over its rows is then the mean of the members' losses."""
    batch, k = outputs.shape[:2]
    return outputs.reshape(batch * k, *outputs.shape[2:]), targets.repeat_interleave(k, dim=0)


def mean_probability_logits(outputs: Tensor, softmax: bool) -> Tensor:
    """The logits of the members' mean probability, from members' logits ``(batch, k, ...)``.

    ``softmax`` (multiclass, over the last dimension): log(mean_i softmax(z_i)), so that softmax and cross entropy
    of the result are the ensemble's probabilities and log loss. Otherwise (binary, multilabel: one sigmoid per
    output): logit(mean_i sigmoid(z_i)) = log p - log(1 - p). Both are computed in log space (``logsumexp`` of the
    members' log probabilities), so a mean probability near 0 or 1 gives a large finite logit, never an infinite
    one.
    """
    log_k = math.log(outputs.shape[MEMBERS_DIM])
    if softmax:
        return torch.logsumexp(F.log_softmax(outputs, dim=-1), dim=MEMBERS_DIM) - log_k
    log_p = torch.logsumexp(F.logsigmoid(outputs), dim=MEMBERS_DIM)
    log_not_p = torch.logsumexp(F.logsigmoid(-outputs), dim=MEMBERS_DIM)
    return log_p - log_not_p


def mean_prediction(outputs: Tensor) -> Tensor:
    """The members' mean ``(batch, ...)`` of their outputs ``(batch, k, ...)`` (regression)."""
    return outputs.mean(dim=MEMBERS_DIM)


__all__ = ["MEMBERS_DIM", "mean_prediction", "mean_probability_logits", "member_rows"]
