"""Checks a task makes against its data and its network's outputs, with messages that say what to set."""

from __future__ import annotations

from typing import Any

from torch import Tensor


def check_data_size(
    task: Any, datamodule: Any, name: str, data_says: str, network: str = "the network's output width"
) -> None:
    """Raise ``ValueError`` when ``datamodule.<name>`` is known and differs from this task's ``<name>``.

    The message reads "<DataModule> has <data_says> but <Task> has <name>=<value>: set <name>
    (model.init_args.<name> in a config) and <network> to <data value>", for Python and YAML users alike; ``data_says`` is formatted with the data module's value ("{} classes").
    """
    data_value = getattr(datamodule, name, None)
    mine = getattr(task, name)
    if data_value is not None and data_value != mine:
        raise ValueError(
            f"{type(datamodule).__name__} has {data_says.format(data_value)} but {type(task).__name__} has "
            f"{name}={mine}: set {name} (model.init_args.{name} in a config) and {network} to {data_value}"
        )


def check_output_shape(
    outputs: Tensor, expected: tuple[str | int, ...], task: str, hint: str = "", exact_ndim: bool = True
) -> None:
    """Raise ``ValueError`` unless the network's ``outputs`` have ``len(expected)`` dimensions (unless not
    ``exact_ndim``) and the last one's size ``expected[-1]``: "<task> expects the network to output shape
    (batch, 3), got (8, 5)<hint>"."""
    if (exact_ndim and outputs.ndim != len(expected)) or outputs.shape[-1] != expected[-1]:
        shape = ", ".join(str(size) for size in expected)
        raise ValueError(f"{task} expects the network to output shape ({shape}), got {tuple(outputs.shape)}{hint}")


__all__ = ["check_data_size", "check_output_shape"]
