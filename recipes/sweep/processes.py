"""A sweep under DDP: rank 0 samples each trial, every process trains the same config.

Lightning's DDP launcher starts the other processes of a machine by running the same command again, once, at the
first ``trainer.fit``; they then stay and take part in every later fit of rank 0's process. In a sweep, those
processes must not ask the study for trials of their own (each would sample other values: lightning-hydra-template's
Optuna sweeper does that). Here rank 0 announces each trial: the first one through the environment the launcher
copies to the processes it starts (``LOOPWISE_SWEEP_TRIAL``), the later ones as a broadcast over the process group
that the first fit set up; ``None`` ends the sweep. A follower (``LOCAL_RANK`` or ``NODE_RANK`` > 0) runs the
announced trials with the announced values, reporting nothing to the study; the pruning callback takes rank 0's
decision (``recipes.callbacks.trial_pruning``). Only the processes of one machine can follow: for several machines,
run a sweep worker per machine on one ``--storage`` instead.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch.distributed as dist

from recipes.sweep.trial import ActiveTrial, RetryOf
from recipes.sweep.trial_cli import run_trial

TRIAL_ENV = "LOOPWISE_SWEEP_TRIAL"


def is_follower() -> bool:
    """Whether this process is a DDP process other than rank 0 (started by the launcher or on another node)."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0) > 0 or int(os.environ.get("NODE_RANK", "0") or 0) > 0


def describe(active: ActiveTrial) -> dict[str, Any]:
    retry = active.retry_of
    return {"number": active.number, "study": active.study_name, "parent": active.parent_run_id,
            "metric": active.metric, "direction": active.direction, "params": active.params,
            # a retry's checkpoint: every process resumes from it (the values it reported are rank 0's business)
            "retry_of": None if retry is None else [retry.number, retry.run_id, retry.checkpoint]}


def announce_trial(active: ActiveTrial | None) -> None:
    """Rank 0: tell the other DDP processes the next trial (``None``: the sweep is over)."""
    message = None if active is None else describe(active)
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list([message], src=0)
    elif message is not None:
        os.environ[TRIAL_ENV] = json.dumps(message)  # copied by the launcher to the processes it starts


def next_trial(first: bool) -> ActiveTrial | None:
    """A follower: the trial rank 0 announced (``None`` when the sweep is over)."""
    if first:
        message = json.loads(os.environ[TRIAL_ENV]) if os.environ.get(TRIAL_ENV) else None
    elif dist.is_available() and dist.is_initialized():
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        message = box[0]
    else:
        message = None
    if message is None:
        return None
    retry = message.get("retry_of")
    return ActiveTrial(None, message["number"], message["study"], message["parent"], message["metric"],
                       message["direction"], message["params"], retry_of=None if retry is None else RetryOf(*retry))


def follow(fit_args: list[str]) -> int:
    """A follower's sweep: run every trial rank 0 announces, until it says the sweep is over."""
    active = next_trial(first=True)
    while active is not None:
        print(f"recipes sweep: rank {os.environ.get('LOCAL_RANK', '0')} follows trial {active.number}: "
              f"{json.dumps(active.params)}", flush=True)
        run_trial(fit_args, active)
        active = next_trial(first=False)
    return 0


__all__ = ["TRIAL_ENV", "announce_trial", "follow", "is_follower", "next_trial"]
