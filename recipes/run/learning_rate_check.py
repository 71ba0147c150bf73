"""Learning rates that are not a finite number of 0 or more (``nan``, ``inf``, negative), refused in one line before
anything runs (0 is allowed: it keeps the weights, a deliberate setting for a frozen run or a test of the loop): on the command line before it is parsed (jsonargparse reads ``nan`` as text and answers with a block
about import paths), and in the parsed config (a YAML ``.nan``, ``-0.1``; torch would say only "Invalid learning
rate", or train on ``inf``)."""

from __future__ import annotations

import math
from typing import Any, Sequence

from jsonargparse import Namespace

#: the last part of a config key that holds a learning rate (an optimizer's ``lr``, ``OneCycle``'s ``max_lr``)
LR_KEYS = ("lr", "max_lr")


def _problem(key: str, value: Any) -> str | None:
    """Why ``value`` is not a learning rate, or ``None`` when it is one (or not a number at all)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None  # not a number: jsonargparse names the key and the expected type
    if math.isfinite(number) and number >= 0:
        return None
    return (
        f"{key} is {value}: a learning rate must be a finite number, 0 or more (e.g. 0.001); "
        "set it to one on the command line or in the config"
    )


def _is_lr_key(key: str) -> bool:
    return key.lstrip("-").rsplit(".", 1)[-1] in LR_KEYS


def check_learning_rate_args(args: Sequence[str]) -> None:
    """``ValueError`` for a command-line learning rate (``--...lr nan``, ``--...lr=-1``) that is not a finite
    number of 0 or more, before the arguments are parsed."""
    args = [str(a) for a in args]
    for i, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        key, sep, value = arg.partition("=")
        if not sep:
            if i + 1 >= len(args):
                continue
            value = args[i + 1]
        if _is_lr_key(key):
            problem = _problem(key.lstrip("-"), value)
            if problem is not None:
                raise ValueError(problem)


def check_learning_rates(cfg: Namespace) -> None:
    """``ValueError`` for a learning rate in the parsed config that is not a finite number of 0 or more."""
    for key, value in cfg.items():
        if _is_lr_key(key) and isinstance(value, (int, float)):
            problem = _problem(key, value)
            if problem is not None:
                raise ValueError(problem)


__all__ = ["check_learning_rate_args", "check_learning_rates"]
