"""A pretrained Hugging Face image classifier (the optional extra ``loopwise[hf]``): any
``AutoModelForImageClassification`` (ViT, DeiT, BEiT, ResNet, ConvNeXt, Swin, ...) from a local directory or the hub,
with a head for the data's classes, shaped like loopwise's own networks (an image batch in, logits out, sizes and
class names linked from the data).

``transformers`` is imported when one is built, never when ``lightning_modules.models`` is imported.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from lightning_modules.models.hf import import_transformers, load_pretrained

#: the logger transformers' multi-line load report (which weights were newly initialized) is written to
LOAD_REPORT_LOGGER = "transformers.modeling_utils"


class _DropLoadReport(logging.Filter):
    """Drops transformers' "LOAD REPORT" record; HFImageClassifier says what happened to the head in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


@contextmanager
def without_load_report() -> Iterator[None]:
    """transformers' load report left out while the block runs (its other messages stay)."""
    logger, drop = logging.getLogger(LOAD_REPORT_LOGGER), _DropLoadReport()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def as_pair(size: Any) -> tuple[int, int] | None:
    """``32`` or ``(32, 32)`` or ``[32, 32]`` as ``(height, width)``; ``None`` stays ``None``."""
    if size is None:
        return None
    if isinstance(size, int):
        return (size, size)
    height, width = size
    return (int(height), int(width))


def head_labels(config: Any) -> list[str]:
    """The pretrained head's labels in output order (``config.id2label``)."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label[i]) for i in sorted(id2label)]


def fixed_input_size(model: nn.Module) -> tuple[int, int] | None:
    """The input size a model takes, for families whose position embeddings fix it (ViT, DeiT, BEiT with absolute
    positions: a parameter named ``position_embeddings`` and ``config.image_size``); ``None`` for those that take
    any size (ResNet, ConvNeXt, ...)."""
    size = getattr(model.config, "image_size", None)
    if size is None or not any("position_embeddings" in name for name, _ in model.named_parameters()):
        return None
    return as_pair(size)


def reset_head(model: nn.Module) -> list[str]:
    """Re-initialize the classification head: the model's children outside its backbone (``base_model_prefix``),
    with each submodule's ``reset_parameters``. Returns the children reset."""
    reset: list[str] = []
    for name, child in model.named_children():
        if name == model.base_model_prefix:
            continue
        for module in child.modules():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        reset.append(name)
    return reset


class HFImageClassifier(nn.Module):
    """A pretrained Hugging Face image classifier:
    ``AutoModelForImageClassification.from_pretrained(name_or_path)`` with a head for the data's classes.

    Called as ``model(pixel_values)`` with the images of ``ImageFolderDataModule`` (float ``(batch, channels,
    height, width)``), it returns the logits ``(batch, num_classes)``. The pretrained head is kept only when its
    labels (``config.id2label``) are the data's class names in the same order; otherwise it is replaced: a new
    head of ``num_classes`` outputs (``ignore_mismatched_sizes``) or, for a head of the same size trained on other
    labels, the same head re-initialized. One line says which. ``config.id2label`` is set to the class names, so a
    model saved with ``save_pretrained`` (``recipes export``) names its outputs.

    Parameter names are the Hugging Face ones under ``model.``: ``freeze: [model.vit.embeddings]``,
    ``lr_multipliers: {model.classifier: 10}``; ``part_names`` lets a recipe say ``backbone`` (``model.vit``,
    ``model.resnet``, ``model.convnext``, ...) and ``head`` (``model.classifier``) for any family;
    ``layerwise_lr_decay`` decays over the model's stack of blocks (``layers`` of a ViT in transformers 5,
    ``encoder.stages`` of a ResNet or ConvNeXt). A checkpoint rebuilds the network from ``name_or_path`` (which
    must still be readable: the directory, or the hub model in the local cache with ``HF_HUB_OFFLINE=1``) and then
    loads its own weights into it.

    Args:
        name_or_path: A local directory written by ``save_pretrained`` (read without any network access) or a hub
            model name such as ``google/vit-base-patch16-224``, downloaded once into the Hugging Face cache.
        num_classes: Number of output logits: the data's classes (linked from the data).
        class_names: The data's class names in label order (linked from the data): they decide whether the
            pretrained head is kept, and become ``config.id2label``. Null: the head is replaced.
        in_channels: Channels of the input images (linked from the data); an error when the model takes another
            number (``config.num_channels``).
        image_size: Input (height, width) or side (linked from the data); an error for a model whose position
            embeddings fix another size (ViT-like); convolutional networks (ResNet, ConvNeXt) take any size.
        revision: Hub revision (branch, tag or commit hash) to load; ignored for a local directory.
    """

    #: the weights come trained: the loop doctor expects no fresh network's first loss
    pretrained: bool = True

    def __init__(
        self,
        name_or_path: str,
        num_classes: int,
        class_names: Sequence[str] | None = None,
        in_channels: int | None = None,
        image_size: int | tuple[int, int] | None = None,
        revision: str | None = None,
    ) -> None:
        super().__init__()
        what = type(self).__name__
        if num_classes < 1:
            raise ValueError(f"{what}: num_classes must be >= 1, got {num_classes}")
        names = None if class_names is None else [str(name) for name in class_names]
        if names is not None and len(names) not in (num_classes, 2 if num_classes == 1 else num_classes):
            raise ValueError(
                f"{what}: {len(names)} class_names for num_classes={num_classes}: give one name per class"
            )
        transformers = import_transformers(what)
        config = load_pretrained(transformers.AutoConfig, name_or_path, what, revision)
        self.check_channels(config, in_channels, what, name_or_path)
        pretrained_labels = head_labels(config)
        keep = names is not None and names == pretrained_labels and len(names) == num_classes
        if not keep:
            labelled = names is not None and len(names) == num_classes
            new = names if labelled else [f"LABEL_{i}" for i in range(num_classes)]
            config.id2label = dict(enumerate(new))
            config.label2id = {name: i for i, name in enumerate(new)}
        with without_load_report():
            model, info = load_pretrained(
                transformers.AutoModelForImageClassification,
                name_or_path,
                what,
                revision,
                config=config,
                ignore_mismatched_sizes=True,
                output_loading_info=True,
            )
        # output_loading_info returns the model as from_pretrained left it: in eval mode (a module is built in train
        # mode) and in the checkpoint's dtype
        self.model = model.float().train()
        backbone = model.base_model_prefix
        head = [name for name, _ in model.named_children() if name != backbone]
        #: ``backbone`` and ``head`` in freeze / unfreeze_at_epoch / lr_multipliers patterns, whatever the family
        self.part_names = {"backbone": f"model.{backbone}", **({"head": f"model.{head[0]}"} if len(head) == 1 else {})}
        self.name_or_path = name_or_path
        self.num_classes = num_classes
        self.class_names = names
        self.in_channels = int(config.num_channels) if hasattr(config, "num_channels") else in_channels
        self.image_size = self.check_image_size(image_size, what, name_or_path)
        self.say_head(info, keep, len(pretrained_labels), what, name_or_path)

    @staticmethod
    def check_channels(config: Any, in_channels: int | None, what: str, name_or_path: str) -> None:
        """``in_channels`` against the model's ``config.num_channels``: one error line naming the fix."""
        channels = getattr(config, "num_channels", None)
        if in_channels is not None and channels is not None and int(in_channels) != int(channels):
            mode = "3 (RGB)" if channels == 3 else "1 (grayscale)" if channels == 1 else str(channels)
            raise ValueError(
                f"{what}: the images have {in_channels} channel(s) but {name_or_path!r} takes {channels}: set the "
                f"data's channels to {mode}"
            )

    def check_image_size(self, image_size: Any, what: str, name_or_path: str) -> tuple[int, int] | None:
        """``image_size`` as (height, width), checked against the size a ViT-like model is fixed to (that size when
        ``image_size`` is None; None for a model that takes any size)."""
        size, fixed = as_pair(image_size), fixed_input_size(self.model)
        if size is not None and min(size) < 1:
            raise ValueError(f"{what}: image_size must be positive, got {image_size}")
        if size is not None and fixed is not None and size != fixed:
            raise ValueError(
                f"{what}: the images are {size[0]}x{size[1]} but {name_or_path!r} takes {fixed[0]}x{fixed[1]} "
                f"(its position embeddings fix the size): set the data's image_size to {list(fixed)}"
            )
        return size if size is not None else fixed

    def say_head(self, info: dict[str, Any], keep: bool, pretrained_count: int, what: str, name_or_path: str) -> None:
        """One line: whether the pretrained head was kept, replaced or re-initialized (resetting it in that case),
        and a warning for backbone weights the directory lacked."""
        mismatched = {key for key, *_ in info.get("mismatched_keys", ())}
        head = [name for name, _ in self.model.named_children() if name != self.model.base_model_prefix]
        missing = sorted(key for key in info.get("missing_keys", ()) if key.split(".", 1)[0] not in head)
        if keep:
            line = f"the pretrained head of {pretrained_count} classes is kept: its labels are the data's class names"
        elif mismatched:
            line = f"a new head of {self.num_classes} classes replaces the pretrained head of {pretrained_count}"
        else:
            reset_head(self.model)
            line = (
                f"the pretrained head of {pretrained_count} classes is re-initialized: its labels are not the data's "
                "class names"
            )
        rank_zero_info(f"{what}: {line} ({name_or_path})")
        if missing:
            rank_zero_info(f"{what}: {len(missing)} backbone weights were not in {name_or_path!r} and start random: "
                           f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")

    def forward(self, pixel_values: Tensor) -> Tensor:
        """Logits ``(batch, num_classes)`` of images ``(batch, channels, height, width)``."""
        if pixel_values.ndim != 4:
            raise ValueError(
                f"HFImageClassifier expects images of shape (batch, channels, height, width), got "
                f"{tuple(pixel_values.shape)}"
            )
        return self.model(pixel_values=pixel_values).logits


__all__ = ["HFImageClassifier"]
