"""A fine-tuned Hugging Face network and its preprocessing, written with ``save_pretrained``, so that
``AutoModelForImageClassification.from_pretrained(dir)`` with ``AutoImageProcessor.from_pretrained(dir)`` (or
``AutoModelForSequenceClassification`` with ``AutoTokenizer``) gives the probabilities of ``recipes predict``.

The image processor reproduces the training preprocessing: the one the data module was trained with
(``image_processor``: rebuilt from the ``{"class", "config"}`` the checkpoint records, only when that names a
transformers ``BaseImageProcessor``: a file never chooses what code runs), else a ``ViTImageProcessor`` of the data
module's own preprocessing (RGB, bilinear resize to ``image_size``, the train mean and std).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from datamodules.recipe_contract import class_names_of, data_size, data_state_of
from lightning_modules.models import HFImageClassifier, HFSequenceClassifier
from lightning_modules.models.hf import import_transformers


class ExportError(ValueError):
    """What cannot be exported, said in one line (the recipes command's ``recipes: error:``)."""


def check_export_dir(directory: str | Path) -> Path:
    """``directory`` as a new or empty folder (files of the user's there are never overwritten)."""
    path = Path(directory).expanduser()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise ExportError(
            f"--export_dir {directory} already exists and is not an empty directory: name a new directory (nothing "
            "there is overwritten)"
        )
    return path


def export_pretrained(network: nn.Module, datamodule: Any, directory: Path) -> list[str]:
    """Write ``network`` (an ``HFImageClassifier`` or ``HFSequenceClassifier`` with its fine-tuned weights) and its
    preprocessing to ``directory`` with ``save_pretrained``; ``config.id2label`` names the data's classes. Returns
    the names of the files written."""
    if isinstance(network, HFImageClassifier):
        preprocessing = image_processor_of(datamodule)
    elif isinstance(network, HFSequenceClassifier):
        preprocessing = tokenizer_of(datamodule)
    else:
        raise ExportError(
            f"export writes Hugging Face networks (HFImageClassifier, HFSequenceClassifier); this recipe's network is "
            f"{type(network).__name__}: use its checkpoint, or its MLflow model (recipes fit logs one)"
        )
    model = network.model
    name_labels(model.config, class_names_of(datamodule), model.config.num_labels)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    if preprocessing is not None:
        preprocessing.save_pretrained(directory)
    return sorted(path.name for path in directory.iterdir())


def name_labels(config: Any, class_names: Any, num_labels: int) -> None:
    """``config.id2label`` / ``label2id`` from the data's class names (one per output)."""
    names = [str(name) for name in class_names] if class_names is not None else None
    if names is None:
        return
    if len(names) != num_labels:
        raise ExportError(
            f"the network has {num_labels} output(s) for {len(names)} classes (a binary task's single logit): export "
            "needs one output per class (task: multiclass)"
        )
    config.id2label = dict(enumerate(names))
    config.label2id = {name: i for i, name in enumerate(names)}


def image_processor_of(datamodule: Any) -> Any:
    """The image processor of the data module's training preprocessing (see the module's docstring)."""
    transformers = import_transformers("recipes export")
    state = data_state_of(datamodule)
    record = state.get("image_processor")
    if record:
        name = str(record.get("class"))
        cls = getattr(transformers, name, None)
        if not (isinstance(cls, type) and issubclass(cls, transformers.BaseImageProcessor)):
            raise ExportError(
                f"the checkpoint's image processor class {name!r} is not a transformers image processor: refusing to "
                "build it; fine-tune with a Hugging Face image processor"
            )
        return cls.from_dict(dict(record.get("config") or {}))
    if getattr(datamodule, "channels", 3) != 3:
        raise ExportError(
            f"the images are grayscale (channels {datamodule.channels}): export writes an RGB image processor; "
            "fine-tune with channels: 3 to export"
        )
    mean, std = state.get("mean"), state.get("std")
    size = data_size(datamodule, "image_size")
    if mean is None or std is None or size is None:
        raise ExportError(
            f"{type(datamodule).__name__} has no image preprocessing to export (image_size and the train mean/std "
            "of an ImageFolderDataModule checkpoint)"
        )
    height, width = size
    processor_class = getattr(transformers, "ViTImageProcessorPil", None) or transformers.ViTImageProcessor
    return processor_class(
        do_resize=True, size={"height": int(height), "width": int(width)},
        resample=transformers.image_utils.PILImageResampling.BILINEAR, do_rescale=True, rescale_factor=1 / 255,
        do_normalize=True, image_mean=[float(m) for m in mean], image_std=[float(s) for s in std],
    )


def tokenizer_of(datamodule: Any) -> Any:
    """The Hugging Face tokenizer the text was encoded with (None for loopwise's word and char tokenizers)."""
    hf = getattr(datamodule, "hf_tokenizer", None)
    if hf is None:
        raise ExportError(
            "the text was encoded with loopwise's own tokenizer, which transformers cannot load: fine-tune with "
            "tokenizer: <the model's name_or_path> to export"
        )
    return hf.tokenizer


__all__ = ["ExportError", "check_export_dir", "export_pretrained"]
