"""Sizes from the data: the network's and the task's input and output sizes are read from the data module.

A recipe does not count columns, classes or characters: ``in_features``, ``out_features``, ``num_classes``,
``in_channels``, ``vocab_size``, ``max_length``, ``block_size``, ``image_size``, ``class_names`` (the network's
only: a pretrained network's head and saved labels) and ``numeric_features`` (the network's only: the leading numeric
positions of a tabular sample, for numerical embeddings) are linked from the data module to the task
(``model.init_args.<name>``) and to its network (``model.init_args.model.init_args.<name>``) with jsonargparse's
``link_arguments(..., apply_on="instantiate")``: the data module is built first, its sizes are read (a file-backed
module reads its file and fits its vocabularies on the train split to know them), and the task and network are built
with them. Each link applies only where the class takes a parameter of that name, so a network of your own (given
by ``class_path``) receives the sizes its constructor names that way; other parameters must be written.

A size written in the recipe is kept when the data agrees and is a one-line error naming both numbers when it does
not (``max_length`` and ``block_size`` are capacities: a written value may be larger than the data's). A value equal
to the parameter's default counts as not written (jsonargparse cannot tell the two apart), so it is replaced by the
data's. A task on data of the wrong kind (a classifier on a regression target, a regression on class labels) is an
error before anything is built.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import LightningModule

from datamodules.recipe_contract import data_size, load_data_state
from lightning_modules.recipe_contract import data_mismatch_of

TASK = "model.init_args."
NETWORK = "model.init_args.model.init_args."
UNKNOWN = object()


class DataSizeError(ValueError):
    """A size written in the recipe disagrees with the data, or the task does not fit the data's kind."""


def read_size(datamodule: Any, name: str) -> Any:
    """``datamodule.<name>``, or ``UNKNOWN`` when the data module has no such attribute."""
    return data_size(datamodule, name, UNKNOWN)


def output_width(datamodule: Any, config: Namespace) -> Any:
    """The network's output width: 1 for a binary classifier, else the data's ``out_features`` (tabular: classes or
    regression targets) or ``num_classes``."""
    if config.get(TASK + "task") == "binary":
        return 1
    width = read_size(datamodule, "out_features")
    return width if width is not UNKNOWN else read_size(datamodule, "num_classes")


def image_pair(size: Any) -> Any:
    """A written ``image_size`` as the data modules give it: ``32`` is ``(32, 32)``, ``[32, 48]`` is ``(32, 48)``."""
    if isinstance(size, int):
        return (size, size)
    return tuple(size) if isinstance(size, (list, tuple)) else size


@dataclass(frozen=True)
class SizeLink:
    """One size linked from the data module to a config key.

    Args:
        target: The config key that receives the size.
        source: The data module's attribute, or a function of (data module, parsed config).
        at_least: The size is a capacity: a written value larger than the data's is kept.
        written_as: How a written value is read before it is compared with the data's (``image_size: 32`` is
            ``(32, 32)``); None: as it is.
    """

    target: str
    source: str | Callable[[Any, Namespace], Any]
    at_least: bool = False
    written_as: Callable[[Any], Any] | None = None

    def data_value(self, datamodule: Any, config: Namespace) -> Any:
        """The data's value of this size (``UNKNOWN`` when the data module does not say)."""
        if callable(self.source):
            return self.source(datamodule, config)
        return read_size(datamodule, self.source)

    @property
    def name(self) -> str:
        """The parameter's name, e.g. ``in_features``."""
        return self.target.rsplit(".", 1)[1]


SIZE_LINKS: tuple[SizeLink, ...] = (
    SizeLink(TASK + "num_classes", "num_classes"),
    SizeLink(TASK + "vocab_size", "vocab_size"),
    SizeLink(TASK + "out_features", "out_features"),
    SizeLink(NETWORK + "in_features", "in_features"),
    SizeLink(NETWORK + "out_features", output_width),
    SizeLink(NETWORK + "num_classes", output_width),
    SizeLink(NETWORK + "in_channels", "in_channels"),
    SizeLink(NETWORK + "vocab_size", "vocab_size"),
    SizeLink(NETWORK + "max_length", "max_length", at_least=True),
    SizeLink(NETWORK + "block_size", "block_size", at_least=True),
    SizeLink(NETWORK + "image_size", "image_size", written_as=image_pair),
    SizeLink(NETWORK + "class_names", "class_names", written_as=list),
    SizeLink(NETWORK + "numeric_features", "numeric_features"),
)


def class_at(config: Namespace, key: str) -> type | None:
    """The class named by ``<key>.class_path`` in the parsed config (already imported by jsonargparse)."""
    class_path = config.get(f"{key}.class_path") if key else None
    if not isinstance(class_path, str) or "." not in class_path:
        return None
    module, name = class_path.rsplit(".", 1)
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def parameter_default(cls: type | None, name: str) -> Any:
    """The default of ``cls.__init__``'s parameter ``name``, or ``UNKNOWN``."""
    if cls is None:
        return UNKNOWN
    try:
        parameter = inspect.signature(cls).parameters.get(name)
    except (TypeError, ValueError):
        return UNKNOWN
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return UNKNOWN
    return parameter.default


class DataSizes:
    """The links of ``SIZE_LINKS`` for a LightningCLI parser, and the check of sizes written in the recipe.

    ``add_links(parser)`` when the parser is built; ``remember(config)`` with the parsed config before the classes
    are instantiated (the written values and the task's class are read from it).
    """

    def __init__(self) -> None:
        self.config = Namespace()
        self.written: dict[str, Any] = {}
        self.not_taken: list[str] = []  # targets the configured classes do not take
        self.data_state: dict[str, Any] | None = None  # a checkpoint's data module state, restored first
        self.restored: set[int] = set()

    def add_links(self, parser: Any) -> None:
        """Link every size of ``SIZE_LINKS`` from ``data`` to its target, applied when the classes are built."""
        for link in SIZE_LINKS:
            parser.link_arguments("data", link.target, compute_fn=self.value_for(link), apply_on="instantiate")

    def remember(self, config: Namespace, data_state: dict[str, Any] | None = None) -> None:
        """The parsed config whose classes are about to be built: the sizes it writes (defaults excluded).

        ``data_state``: the data module's state saved in the checkpoint being evaluated (encodings, vocabularies,
        class names). It is loaded into the data module before any size is read, so the sizes and the
        preprocessing are the checkpoint's, never fitted anew (predicting a new file needs no training file).
        """
        self.config = config
        self.data_state = data_state
        self.written = {}
        self.not_taken = [link.target for link in SIZE_LINKS if link.target not in config]
        for link in SIZE_LINKS:
            value = config.get(link.target)
            if value is None:
                continue
            owner = link.target.rsplit(".init_args.", 1)[0]
            if value != parameter_default(class_at(config, owner), link.name):
                self.written[link.target] = value

    def value_for(self, link: SizeLink) -> Callable[[Any], Any]:
        """The compute function of ``link``: the data's value, checked against the written one."""

        def compute(datamodule: Any) -> Any:
            self.restore(datamodule)
            self.check_task_fits(datamodule)
            written = self.written.get(link.target, UNKNOWN)
            if written is not UNKNOWN and link.written_as is not None:
                written = link.written_as(written)
            data = link.data_value(datamodule, self.config)
            if data is not UNKNOWN and data is not None and link.written_as is not None:
                data = link.written_as(data)
            if data is UNKNOWN or data is None:
                return self.config.get(link.target) if written is UNKNOWN else written
            if written is UNKNOWN or written == data or (link.at_least and written > data):
                return data if written is UNKNOWN else written
            bound = f"at least {data}" if link.at_least else str(data)
            raise DataSizeError(
                f"{link.target} is {written} in the config, but {type(datamodule).__name__} has {link.name} {data}: "
                f"leave {link.name} out of the recipe (the data sets it) or make it {bound}"
            )

        compute.__name__ = f"size_from_data[{link.name}]"
        return compute

    def restore(self, datamodule: Any) -> None:
        """Load the checkpoint's data state into ``datamodule`` once (Lightning loads it again later: a no-op)."""
        if self.data_state is None or id(datamodule) in self.restored:
            return
        self.restored.add(id(datamodule))
        load_data_state(datamodule, self.data_state)

    def check_task_fits(self, datamodule: Any) -> None:
        """A task on data of another kind is an error: the task class's ``data_mismatch(datamodule)`` says why."""
        task = class_at(self.config, "model")
        reason = data_mismatch_of(task, datamodule)
        if reason:
            raise DataSizeError(reason)


    def prune_hyperparameters(self, task: Any) -> None:
        """Drop from ``task.hparams`` the sizes its classes do not take.

        Lightning's CLI writes the value of every applied instantiation link into the module's hyperparameters,
        also where jsonargparse ignored the link because the class has no such parameter (``in_features`` of a
        ``ConvNet``); a checkpoint with those would not rebuild its module. Call after the classes are built.
        """
        hparams = task.hparams if isinstance(task, LightningModule) else None  # Lightning's own member
        if hparams is None:
            return
        for target in self.not_taken:
            keys = target[len("model.init_args.") :].replace(".init_args.", ".init_args|").split(".")
            path = [part for key in keys for part in key.split("|")]
            node: Any = hparams
            for part in path[:-1]:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.pop(path[-1], None)


def data_size_error(err: BaseException) -> BaseException | None:
    """What went wrong while reading the data's sizes: the ``DataSizeError`` behind ``err``, or the data module's
    own error (jsonargparse wraps an exception of a link's compute function in a ValueError of its own that
    prints the data module), or ``None`` when ``err`` did not come from a size link."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, DataSizeError):
            return seen
        if str(seen).startswith("Call to compute_fn of link") and seen.__cause__ is not None:
            return data_size_error(seen.__cause__) or seen.__cause__
        seen = seen.__cause__ or seen.__context__
    return None
