"""Which values a command with ``--ckpt_path`` takes from the checkpoint and which from the command line, and the
one-line notice where they differ.

The rule (Lightning's ``LightningCLI`` reads the checkpoint's saved hyperparameters into the config after the
command line is parsed, ``_parse_ckpt_path``; Lightning's trainer restores the training state):

* **From the checkpoint: the whole task** (``model``: the network and its shapes, the loss, the optimizer and its
  learning rate, weight decay and betas, the schedule, the fine-tuning settings, the monitor), its weights, the
  optimizer's and the schedule's state (their step), the callbacks' state (the best so far, early stopping's
  count), and the data encodings the data module saved (vocabularies, statistics, class names). A resume is the same
  run continuing, bit for bit; a task value given again on the command line that differs from the checkpoint's is
  not used, and says so in one line (``recipes: notice: ...``).
* **From the command: everything else**: the trainer (``max_epochs``, ``max_steps``, devices, precision,
  accumulation, clipping, the checkpoint cadence), the data loader (``batch_size``, workers) and the tracking. A
  longer ``max_epochs`` lengthens the schedule from the step the run is at (the training plan's warning names it).
  The data's split settings must match the checkpoint's for an evaluation (``recipes.checkpoints.data_guard``).

To train on with other task values (another learning rate, a wider network), start a new run from the checkpoint's
weights: ``--model.init_args.init_from <checkpoint>`` without ``--ckpt_path``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from jsonargparse import Namespace

#: keys whose values are not the user's to give (links from the data module, jsonargparse's bookkeeping)
SKIPPED = ("class_path", "__path__", "_instantiator", "dict_kwargs")


def flattened(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of every leaf of a config part (a Namespace or a mapping)."""
    items = value.as_dict() if isinstance(value, Namespace) else value
    if not isinstance(items, Mapping):
        yield prefix, value
        return
    for key, inner in items.items():
        if key in SKIPPED:
            continue
        yield from flattened(inner, f"{prefix}.{key}" if prefix else str(key))


def comparable(value: Any) -> Any:
    """Tuples and lists compare equal (YAML gives lists, a saved checkpoint may hold tuples)."""
    if isinstance(value, (list, tuple)):
        return [comparable(v) for v in value]
    return value


def task_values_replaced(command_model: Any, checkpoint_model: Any,
                         linked: frozenset[str] = frozenset()) -> list[tuple[str, Any, Any]]:
    """``(key under model, the command's value, the checkpoint's value)`` for each task value the command's config
    sets (not ``None``) that the checkpoint's hyperparameters replace with another value; ``linked``: the config
    keys the data module sets (``model.init_args.num_classes``, ...), which are not the user's."""
    if command_model is None or checkpoint_model is None:
        return []
    mine = dict(flattened(command_model))
    theirs = dict(flattened(checkpoint_model))
    return [(key, value, theirs[key]) for key, value in mine.items()
            if value is not None and key in theirs and f"model.{key}" not in linked
            and comparable(theirs[key]) != comparable(value)]


def notice_lines(replaced: list[tuple[str, Any, Any]], subcommand: str) -> list[str]:
    """One ``recipes: notice:`` line per replaced value."""
    what = "a resume continues the checkpoint's run" if subcommand == "fit" else "the checkpoint's task is evaluated"
    fix = (" (a new run, without --ckpt_path, trains with yours; --model.init_args.init_from <checkpoint> starts it "
           "from these weights)" if subcommand == "fit" else "")
    return [f"recipes: notice: --model.{key} is {value!r} here but {saved!r} in the checkpoint; {what}, so "
            f"{saved!r} is used{fix}" for key, value, saved in replaced]


__all__ = ["flattened", "notice_lines", "task_values_replaced"]
