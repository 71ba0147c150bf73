"""``add_missing_init_args``: an empty ``init_args`` beside every ``class_path`` of a config that lacks one."""

from __future__ import annotations

from typing import Any


def add_missing_init_args(node: Any) -> None:
    """Give every mapping with a ``class_path`` and no ``init_args`` an empty ``init_args`` (in place)."""
    if isinstance(node, dict):
        if "class_path" in node and node.get("init_args") is None:
            node["init_args"] = {}
        for value in node.values():
            add_missing_init_args(value)
    elif isinstance(node, list):
        for value in node:
            add_missing_init_args(value)


__all__ = ["add_missing_init_args"]
