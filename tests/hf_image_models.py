"""Tiny Hugging Face image classifiers and their image processors built and saved locally, standing in for hub models
in tests (nothing is downloaded: the tests run with HF_HUB_OFFLINE=1, see conftest.py), and a folder of real images.

``local_hf_image_models()`` builds, once per process, a tiny ViT, ResNet and ConvNeXt image classifier with random
weights under a fixed seed, each saved with ``save_pretrained`` together with the image processor such a hub model
ships (ViT: ``ViTImageProcessor`` resizing to the model's square input; ResNet and ConvNeXt: ``ConvNextImageProcessor``
with ``shortest_edge`` and ``crop_pct=0.875``, as microsoft/resnet-50 and facebook/convnext-tiny-224 ship). Their
heads have ``PRETRAINING_CLASSES`` labels, standing in for the classes a hub model was trained on.

``digits_folder(root)`` writes scikit-learn's bundled 8x8 digits, upscaled to RGB PNG files, one sub-folder per class.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# the classes the tiny models' heads were "pretrained" on (5 of them, so a 5-class data set of other names is a
# same-size head of other labels)
PRETRAINING_CLASSES = ("cat", "dog", "bird", "fish", "frog")
DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def labels(num_labels: int) -> dict[int, str]:
    """``id2label`` of the "pretraining" classes (``class<i>`` beyond the named ones)."""
    return {i: PRETRAINING_CLASSES[i] if i < len(PRETRAINING_CLASSES) else f"class{i}" for i in range(num_labels)}


def quiet_processor(name: str, **kwargs: Any) -> Any:
    """``transformers.<name>(**kwargs)`` without the warning about the PIL fallback (torchvision is not installed)."""
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(transformers, name)(**kwargs)


def save(model: Any, processor: Any, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory


def build_tiny_vit(
    directory: Path, num_labels: int = 5, image_size: int = 32, num_channels: int = 3, seed: int = 0
) -> Path:
    """A 2-layer ViT (width 32, 2 heads, patch 8, ``image_size`` square input) with a ``ViTImageProcessor``
    resizing to ``image_size``, saved to ``directory``; the head has ``num_labels`` outputs."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(seed)
    id2label = labels(num_labels)
    config = ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=image_size,
        patch_size=8, num_channels=num_channels, id2label=id2label, label2id={v: k for k, v in id2label.items()},
    )
    processor = quiet_processor("ViTImageProcessor", size={"height": image_size, "width": image_size})
    return save(ViTForImageClassification(config), processor, directory)


def build_tiny_resnet(
    directory: Path, num_labels: int = 5, image_size: int = 32, num_channels: int = 3, seed: int = 0
) -> Path:
    """A 2-stage ResNet (basic blocks, widths 16 and 32, one block a stage) with a ``ConvNextImageProcessor``
    (``shortest_edge`` = ``image_size``, ``crop_pct`` 0.875), saved to ``directory``; ``num_labels`` outputs."""
    import torch
    from transformers import ResNetConfig, ResNetForImageClassification

    torch.manual_seed(seed)
    id2label = labels(num_labels)
    config = ResNetConfig(
        num_channels=num_channels, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
        id2label=id2label, label2id={v: k for k, v in id2label.items()},
    )
    processor = quiet_processor("ConvNextImageProcessor", size={"shortest_edge": image_size}, crop_pct=0.875)
    return save(ResNetForImageClassification(config), processor, directory)


def build_tiny_convnext(
    directory: Path, num_labels: int = 5, image_size: int = 32, num_channels: int = 3, seed: int = 0
) -> Path:
    """A 2-stage ConvNeXt (widths 16 and 32, one block a stage, patch 4) with a ``ConvNextImageProcessor``
    (``shortest_edge`` = ``image_size``, ``crop_pct`` 0.875), saved to ``directory``; ``num_labels`` outputs."""
    import torch
    from transformers import ConvNextConfig, ConvNextForImageClassification

    torch.manual_seed(seed)
    id2label = labels(num_labels)
    config = ConvNextConfig(
        num_channels=num_channels, patch_size=4, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1],
        image_size=image_size, id2label=id2label, label2id={v: k for k, v in id2label.items()},
    )
    processor = quiet_processor("ConvNextImageProcessor", size={"shortest_edge": image_size}, crop_pct=0.875)
    return save(ConvNextForImageClassification(config), processor, directory)


BUILDERS = {"vit": build_tiny_vit, "resnet": build_tiny_resnet, "convnext": build_tiny_convnext}


@functools.lru_cache(maxsize=None)
def local_hf_image_models() -> dict[str, Path]:
    """``{"vit": directory, "resnet": directory, "convnext": directory}``, built once per process (5 labels,
    32x32 RGB) in a temporary directory removed at exit."""
    root = Path(tempfile.mkdtemp(prefix="loopwise-hf-image-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return {name: build(root / name) for name, build in BUILDERS.items()}


def digits_folder(
    root: Path,
    digits: Iterable[int] = range(10),
    size: int = 32,
    per_class: int | None = None,
    seed: int = 0,
    names: bool = False,
) -> Path:
    """scikit-learn's bundled 8x8 digits, upscaled with Pillow's bilinear filter to ``size`` x ``size`` RGB PNG
    files in ``root/<class>/<index>.png`` (class ``0``..``9``, or ``zero``..``nine`` with ``names``). ``per_class``
    images of each digit (all ~180 when None), chosen by ``seed``; the same arguments write the same files."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    rng = np.random.default_rng(seed)
    root = Path(root)
    for digit in digits:
        indices = np.flatnonzero(data.target == digit)
        if per_class is not None:
            indices = np.sort(rng.choice(indices, size=min(per_class, len(indices)), replace=False))
        folder = root / (DIGIT_NAMES[digit] if names else str(digit))
        folder.mkdir(parents=True, exist_ok=True)
        for index in indices:
            pixels = (data.images[index] * (255.0 / 16.0)).round().astype(np.uint8)
            image = Image.fromarray(pixels).resize((size, size), Image.Resampling.BILINEAR)
            image.convert("RGB").save(folder / f"{index:04d}.png")
    return root


@functools.lru_cache(maxsize=None)
def local_digits_folder() -> Path:
    """A folder of 12 digit images per class (32x32 RGB PNG, ``digits_folder``), written once per process in a
    temporary directory removed at exit: the image recipes' folder in the tests."""
    root = Path(tempfile.mkdtemp(prefix="loopwise-digits-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return digits_folder(root / "digits", per_class=12)
