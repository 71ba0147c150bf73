"""A checkpoint never chooses what is imported: the class paths in its ``hyper_parameters`` are compared, as text,
with the ones the config names at the same place, before LightningCLI parses them into the config.

A config's ``class_path`` runs the user's own code by design (the user wrote it, or chose the recipe that does). A
checkpoint is data: LightningCLI (2.6) parses a ``--ckpt_path`` file's ``hyper_parameters`` into the config, and
jsonargparse imports every import path it meets there, a ``class_path`` or a plain string where a callable or a class
is expected (and a bare name there chooses among the classes already imported). So every such string of the
checkpoint must be the one the config holds at that place; anything else is refused with one line, naming the place,
the class and the fix.

The places: the checkpoint's top-level ``_class_path`` is the config's ``model.class_path``; any other key ``k`` of
its hyperparameters is ``model.init_args.k`` (or ``model.dict_kwargs.k``); below that both use jsonargparse's
``class_path``/``init_args`` layout, so ``model.class_path`` in the checkpoint is ``model.init_args.model.class_path``
in the config.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jsonargparse import Namespace

CLASS_PATH_KEY = "class_path"
SKIPPED_KEYS = ("_instantiator",)  # LightningCLI drops it before parsing (Lightning's loader has an allowlist)
#: hyperparameters whose plain strings jsonargparse never imports: a task's ``init_from`` is ``str |
#: InitialWeightsSpec`` (a TypedDict), so a file name there ("net.pt") is no import path (a class_path is still refused)
DATA_KEYS = ("init_from",)
_NOTHING = object()  # no value at this place of the config


class ForeignClassPath(ValueError):
    """A checkpoint's hyperparameters name a class (or an import path) the config does not name at that place."""


@dataclass(frozen=True)
class Mismatch:
    """One import path of a checkpoint that the config does not hold at the same place."""

    place: str  # in the checkpoint's hyper_parameters, e.g. "model.class_path"
    config_place: str  # the same place in the config, e.g. "model.init_args.model.class_path"
    saved: Any  # the checkpoint's value
    configured: Any  # the config's value there (``None`` when it has none)
    is_class: bool  # a ``class_path`` (True) or a plain import path where a callable or class may be expected


def is_import_path(value: Any) -> bool:
    """Whether jsonargparse could import ``value``: a dotted path of identifiers (``a.b``, ``pkg.mod.Class``), the
    test of its ``import_object``."""
    return isinstance(value, str) and "." in value and all(part.isidentifier() for part in value.split("."))


def child(node: Any, key: Any) -> Any:
    """``node[key]`` for a config node (Namespace, dict or list), or ``_NOTHING``."""
    if isinstance(node, Namespace):
        return vars(node).get(key, _NOTHING) if isinstance(key, str) else _NOTHING
    if isinstance(node, Mapping):
        return node.get(key, _NOTHING)
    if isinstance(node, (list, tuple)) and isinstance(key, int) and 0 <= key < len(node):
        return node[key]
    return _NOTHING


def class_of(node: Any) -> Any:
    """What a config node names as a class: its ``class_path`` (a Namespace or dict), or the node itself (a string,
    or a class or function that jsonargparse resolved already)."""
    if isinstance(node, (Namespace, Mapping)):
        return child(node, CLASS_PATH_KEY)
    return node


def names_same_object(saved: str, configured: Any) -> bool:
    """Whether the import path ``saved`` equals what the config holds: the same string, or the path of the same
    already imported object (``torch.optim.AdamW`` for the class ``torch.optim.adamw.AdamW``), looked up in
    ``sys.modules`` only, never imported."""
    if isinstance(configured, str) or configured is None or configured is _NOTHING:
        return saved == configured
    if saved == f"{getattr(configured, '__module__', '')}.{getattr(configured, '__qualname__', '')}":
        return True
    parts = saved.split(".")
    for split in range(len(parts) - 1, 0, -1):
        found: Any = sys.modules.get(".".join(parts[:split]))
        for name in parts[split:]:
            found = vars(found).get(name, _NOTHING) if hasattr(found, "__dict__") else _NOTHING
        if found is not _NOTHING:
            return found is configured
    return False


def mismatches(
    saved: Any, configured: Any, place: list[str], config_place: list[str], strings: bool = True
) -> Iterator[Mismatch]:
    """Every import path below ``saved`` (a checkpoint's value) that ``configured`` (the config's value at the same
    place) does not hold; ``strings=False``: ``class_path`` entries only (plain strings there are data)."""
    if isinstance(saved, Mapping):
        for key, value in saved.items():
            here, there = [*place, str(key)], [*config_place, str(key)]
            if key == CLASS_PATH_KEY:
                expected = class_of(configured)
                if not (isinstance(value, str) and names_same_object(value, expected)):
                    yield Mismatch(".".join(here), ".".join(there), value, _shown(expected), True)
            else:
                yield from mismatches(value, child(configured, key), here, there, strings)
    elif isinstance(saved, (list, tuple)):
        for index, value in enumerate(saved):
            yield from mismatches(value, child(configured, index), [*place, str(index)], [*config_place, str(index)],
                                  strings)
    elif strings and isinstance(saved, str) and (is_import_path(saved) or names_a_class(configured)):
        if not names_same_object(saved, class_of(configured)):
            yield Mismatch(".".join(place), ".".join(config_place), saved, _shown(class_of(configured)), False)


def names_a_class(node: Any) -> bool:
    """Whether a config node chooses a class or a callable (a ``class_path``, or one jsonargparse resolved): there a
    checkpoint's bare name (``ConvNet``) would choose among the classes already imported."""
    if isinstance(node, (Namespace, Mapping)):
        return child(node, CLASS_PATH_KEY) is not _NOTHING
    return node is not _NOTHING and node is not None and callable(node)


def _shown(value: Any) -> Any:
    """A config value as the message shows it."""
    if value is _NOTHING or value is None:
        return None
    if isinstance(value, str):
        return value
    return f"{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__name__)}"


def foreign_class_paths(hyper_parameters: Any, model_config: Any) -> list[Mismatch]:
    """The import paths of a checkpoint's ``hyper_parameters`` that the config's ``model`` (a parsed Namespace) does
    not name at the same place, in the checkpoint's order."""
    if not isinstance(hyper_parameters, Mapping):
        return []
    init_args = child(model_config, "init_args")
    dict_kwargs = child(model_config, "dict_kwargs")
    found: list[Mismatch] = []
    for key, value in hyper_parameters.items():
        if key in SKIPPED_KEYS:
            continue
        if key == "_class_path":
            expected = class_of(model_config)
            if not (isinstance(value, str) and names_same_object(value, expected)):
                found.append(Mismatch("_class_path", "model.class_path", value, _shown(expected), True))
            continue
        configured = child(init_args, key)
        section = "init_args"
        if configured is _NOTHING and child(dict_kwargs, key) is not _NOTHING:
            configured, section = child(dict_kwargs, key), "dict_kwargs"
        found.extend(mismatches(value, configured, [str(key)], ["model", section, str(key)], key not in DATA_KEYS))
    return found


def check_checkpoint_classes(path: str, hyper_parameters: Any, model_config: Any) -> None:
    """Refuse a checkpoint whose hyperparameters name a class (or an import path) that the config does not name at
    the same place: ``ForeignClassPath`` with one line naming the first such place, what the config names there, and
    the fix. Nothing is imported."""
    found = foreign_class_paths(hyper_parameters, model_config)
    if not found:
        return
    first = found[0]
    what = "the class" if first.is_class else "the import path"
    config_has = f"names {first.configured!r} there" if first.configured is not None else "names nothing there"
    more = f" ({len(found) - 1} more such place(s))" if len(found) > 1 else ""
    if first.place.split(".")[0] in DATA_KEYS:  # no class can go there: nothing to name in the config
        raise ForeignClassPath(
            f"--ckpt_path {path}: its hyperparameters name {what} {first.saved!r} at {first.place}, where a task "
            "takes a file name or a mapping, never a class; a checkpoint never chooses what is imported: use a "
            "checkpoint that the recipes wrote"
        )
    settable = is_import_path(first.saved) and not any(part.isdigit() for part in first.config_place.split("."))
    flag = f" (--{first.config_place} {first.saved})" if settable else ""
    raise ForeignClassPath(
        f"--ckpt_path {path}: its hyperparameters name {what} {first.saved!r} at {first.place}, but the config "
        f"{config_has} ({first.config_place}){more}; a checkpoint never chooses what is imported: use the recipe it "
        f"was trained with, or, if you trust it, name it in your config yourself{flag}"
    )
