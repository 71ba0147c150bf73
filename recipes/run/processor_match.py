"""The data's image processor against the pretrained network's own: a fine-tune whose images are prepared otherwise
than the network was pretrained on (another size, mean or std) trains, and learns worse, without a word; this says so
in one warning line before training.

Only a network that names its pretrained directory or hub model (``HFImageClassifier.name_or_path``) and a data module
with an ``image_processor`` of another name are compared; the network's own processor is read from its directory
(or the local Hugging Face cache), and a network that ships none is not compared.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from datamodules.image_processor import ImagePreprocessing, load_image_processor
from lightning_modules.recipe_contract import network_of

#: relative tolerance on mean and std (processors write them with 3 to 8 digits)
TOLERANCE = 1e-3


def differences(data: ImagePreprocessing, network: ImagePreprocessing) -> list[str]:
    """What the data's preprocessing does otherwise than the network's: image size, mean, std (in words)."""
    found = []
    if data.image_size != network.image_size:
        found.append(f"image size {data.image_size[0]}x{data.image_size[1]} vs {network.image_size[0]}x"
                     f"{network.image_size[1]}")
    (data_mean, data_std), (net_mean, net_std) = data.normalization(), network.normalization()
    for name, ours, theirs in (("mean", data_mean, net_mean), ("std", data_std, net_std)):
        if not all(math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=1e-6) for a, b in zip(ours, theirs)):
            found.append(f"{name} {[round(v, 4) for v in ours]} vs {[round(v, 4) for v in theirs]}")
    return found


def processor_mismatch(network: Any, datamodule: Any) -> str | None:
    """The warning line when ``datamodule``'s image processor prepares images otherwise than the processor shipped
    with ``network``'s pretrained weights, else ``None`` (also when either side has nothing to compare)."""
    name_or_path = getattr(network, "name_or_path", None)
    processor = getattr(datamodule, "image_processor", None)
    if not isinstance(name_or_path, str) or not isinstance(processor, str) or processor == name_or_path:
        return None
    try:
        data_side = datamodule.prepare
        network_side, _ = load_image_processor(name_or_path, type(network).__name__)
    except (ValueError, OSError):  # the network ships no processor, or the data's cannot be loaded (said elsewhere)
        return None
    if data_side is None:
        return None
    found = differences(data_side, network_side)
    if not found:
        return None
    return (
        f"the data's image_processor {processor!r} prepares images otherwise than the processor of the pretrained "
        f"network {name_or_path!r} ({'; '.join(found)}): its weights expect the network's; set "
        f"data.init_args.image_processor: {name_or_path} (or keep yours on purpose, e.g. to fine-tune at another "
        "size)"
    )


def warn_if_processor_differs(task: Any, datamodule: Any) -> None:
    """``processor_mismatch`` of the task's network and the data, as one warning."""
    line = processor_mismatch(network_of(task), datamodule)
    if line is not None:
        warnings.warn(line, UserWarning, stacklevel=2)


__all__ = ["differences", "processor_mismatch", "warn_if_processor_differs"]
