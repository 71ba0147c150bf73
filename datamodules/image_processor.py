"""A Hugging Face image processor as ``ImageFolderDataModule`` uses it (the optional extra ``loopwise[hf]``).

``image_processor: <local directory or hub name>`` loads the processor with ``AutoImageProcessor.from_pretrained``
(``transformers`` is imported then, never when ``datamodules`` is imported) and derives from it the preprocessing the
data module runs itself with Pillow, as the processor's PIL implementation does: RGB conversion (transparency
composited onto white), the resize rule and filter, the center crop, the rescale factor and the normalization.
The derived ``ImagePreprocessing`` is plain values: a checkpoint stores it, so predicting and the MLflow model never
need the processor again. An option this pipeline cannot reproduce (padding, a resize rule of its own) is one
``ValueError`` line naming it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from datamodules.hf_tokenizer import HF_EXTRA, looks_like_a_path

#: ConvNeXt's rule (``ConvNextImageProcessor``, also ResNet's processor): below this ``shortest_edge`` the shorter
#: side is resized to ``shortest_edge / crop_pct`` and center-cropped; from it on the image is warped to a square.
CONVNEXT_WARP_FROM = 384
#: What the PIL backend's own methods do; a processor class that overrides one of them (beyond the known ones)
#: preprocesses in a way of its own.
STANDARD_METHODS = ("resize", "center_crop", "rescale", "normalize", "_preprocess")
#: Overrides that change nothing for the image (BEiT's ``_preprocess`` adds only segmentation-label handling) or
#: that ``ImagePreprocessing`` reproduces (ConvNeXt's ``crop_pct`` resize).
KNOWN_OVERRIDES = {"ConvNextImageProcessor": ("resize", "_preprocess"), "BeitImageProcessor": ("_preprocess",)}


@dataclass(frozen=True)
class ImagePreprocessing:
    """What is done to every image: plain values, stored in checkpoints as a dict (``to_state``).

    An image is converted to RGB, resized (``resize`` "warp": to ``resize_size`` = (height, width) ignoring the
    aspect ratio; "shortest_edge": its shorter side to ``resize_size[0]`` pixels, keeping the aspect ratio, the longer
    side truncated to an int) with the Pillow filter ``resample``, center-cropped to ``crop`` (zero-padded where
    the image is smaller), then its values are multiplied by ``rescale`` and normalized with ``mean`` and ``std``.
    """

    resize: str
    resize_size: tuple[int, int]
    crop: tuple[int, int] | None
    resample: int
    rescale: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def image_size(self) -> tuple[int, int]:
        """``(height, width)`` of every prepared image."""
        return self.crop if self.crop is not None else self.resize_size

    def normalization(self) -> tuple[list[float], list[float]]:
        """Mean and std of pixel values scaled to [0, 1] (how the data module's datasets normalize) that equal
        ``(value * rescale - mean) / std`` for values in [0, 255]."""
        unit = 255.0 * self.rescale
        return [m / unit for m in self.mean], [s / unit for s in self.std]

    def __call__(self, image: Image.Image) -> np.ndarray:
        """The prepared uint8 ``(height, width, 3)`` array of a decoded 8-bit image."""
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            background = Image.new("RGBA", image.size, (255, 255, 255, 255))
            image = Image.alpha_composite(background, image.convert("RGBA"))
        image = image.convert("RGB")
        if self.resize == "warp":
            height, width = self.resize_size
        else:
            side = self.resize_size[0]
            short, long = sorted((image.height, image.width))
            height, width = (side, int(side * long / short))
            if image.width < image.height:
                height, width = width, height
        if image.size != (width, height):
            image = image.resize((width, height), resample=self.resample)
        array = np.array(image, dtype=np.uint8)
        return center_crop(array, self.crop) if self.crop is not None else array

    def to_state(self) -> dict[str, Any]:
        """Plain lists, numbers and strings (safe for ``weights_only`` checkpoint loading)."""
        state = asdict(self)
        return {key: list(value) if isinstance(value, tuple) else value for key, value in state.items()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "ImagePreprocessing":
        """The preprocessing a ``to_state`` dict describes."""
        crop = state.get("crop")
        ints = lambda values: tuple(int(v) for v in values)  # noqa: E731
        floats = lambda values: tuple(float(v) for v in values)  # noqa: E731
        return cls(
            resize=str(state["resize"]), resize_size=ints(state["resize_size"]),
            crop=ints(crop) if crop is not None else None, resample=int(state["resample"]),
            rescale=float(state["rescale"]), mean=floats(state["mean"]), std=floats(state["std"]),
        )

    def describe(self) -> str:
        """One line: size rule, crop, filter, rescale and normalization."""
        crop = f", center crop {self.crop[0]}x{self.crop[1]}" if self.crop else ""
        size = "x".join(map(str, self.resize_size)) if self.resize == "warp" else f"shorter side {self.resize_size[0]}"
        return (
            f"resize {self.resize} {size}{crop}, resample {self.resample}, rescale {self.rescale:g}, "
            f"mean {list(self.mean)}, std {list(self.std)}"
        )


def center_crop(array: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """The ``size`` = (height, width) center of an ``(H, W, C)`` array, zero-padded where it is smaller (the rounding of
    transformers' ``center_crop``)."""
    height, width = array.shape[:2]
    crop_height, crop_width = size
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    if top >= 0 and left >= 0 and top + crop_height <= height and left + crop_width <= width:
        return array[top : top + crop_height, left : left + crop_width]
    new_height, new_width = max(crop_height, height), max(crop_width, width)
    padded = np.zeros((new_height, new_width, *array.shape[2:]), dtype=array.dtype)
    top_pad, left_pad = math.ceil((new_height - height) / 2), math.ceil((new_width - width) / 2)
    padded[top_pad : top_pad + height, left_pad : left_pad + width] = array
    top, left = top + top_pad, left + left_pad
    return padded[max(0, top) : min(new_height, top + crop_height), max(0, left) : min(new_width, left + crop_width)]


def processor_family(processor: Any) -> str:
    """The processor's class name without its backend's suffix (``ConvNextImageProcessor`` for ``...Pil``)."""
    name = type(processor).__name__
    for suffix in ("Pil", "Fast"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def own_methods(processor: Any) -> list[str]:
    """The standard preprocessing methods the processor's class overrides beyond the known overrides."""
    cls = type(processor)
    backend = next((base for base in cls.__mro__ if base.__name__ in ("PilBackend", "TorchvisionBackend")), None)
    if backend is None:
        return []
    known = KNOWN_OVERRIDES.get(processor_family(processor), ())
    return [m for m in STANDARD_METHODS if m not in known and getattr(cls, m, None) is not getattr(backend, m, None)]


def three(value: Any, name: str) -> tuple[float, float, float]:
    """A per-channel value of an RGB processor (one number stands for all three)."""
    values = [float(value)] * 3 if isinstance(value, (int, float)) else [float(v) for v in value]
    if len(values) != 3:
        raise ValueError(f"{name} {list(values)} has {len(values)} values; an RGB image needs 3")
    return values[0], values[1], values[2]


def size_dict(value: Any) -> dict[str, int]:
    """A processor's ``size``/``crop_size`` (a ``SizeDict`` or a dict) as a dict of its set keys."""
    if value is None:
        return {}
    items = value.items() if hasattr(value, "items") else vars(value).items()
    return {str(k): int(v) for k, v in items if v is not None}


def derive_preprocessing(processor: Any) -> ImagePreprocessing:
    """The preprocessing of a transformers image processor, or a ``ValueError`` naming the option it cannot follow."""
    family = processor_family(processor)
    overridden = own_methods(processor)
    if overridden:
        raise ValueError(f"{family} preprocesses in a way of its own ({', '.join(overridden)}), which is not supported")
    if getattr(processor, "do_pad", None):
        raise ValueError("do_pad: padding is not supported; set do_pad false in the processor's config")
    if not getattr(processor, "do_resize", True):
        raise ValueError("do_resize false would keep every image's own size; set do_resize true and a size")
    size = size_dict(getattr(processor, "size", None))
    do_crop = bool(getattr(processor, "do_center_crop", None))
    crop_size = size_dict(getattr(processor, "crop_size", None)) if do_crop else {}
    if do_crop and set(crop_size) != {"height", "width"}:
        raise ValueError(f"crop_size {crop_size} is not supported; it needs height and width")
    crop = (crop_size["height"], crop_size["width"]) if do_crop else None
    if set(size) == {"height", "width"}:
        resize, resize_size = "warp", (size["height"], size["width"])
    elif set(size) == {"shortest_edge"}:
        edge = size["shortest_edge"]
        crop_pct = getattr(processor, "crop_pct", None)
        if family == "ConvNextImageProcessor" and edge >= CONVNEXT_WARP_FROM:
            resize, resize_size = "warp", (edge, edge)
        elif family == "ConvNextImageProcessor":
            if not crop_pct:
                raise ValueError(f"crop_pct {crop_pct!r} is not supported; ConvNeXt's resize needs one in (0, 1]")
            resize, resize_size = "shortest_edge", (int(edge / crop_pct), int(edge / crop_pct))
            if crop is not None:
                raise ValueError("do_center_crop with ConvNeXt's crop_pct crops twice; set do_center_crop false")
            crop = (edge, edge)
        elif crop is None:
            raise ValueError(
                f"size {size} without do_center_crop gives images of different sizes; set do_center_crop and crop_size"
            )
        else:
            resize, resize_size = "shortest_edge", (edge, edge)
    else:
        raise ValueError(f"size {size} is not supported; it needs height and width, or shortest_edge")
    resample = getattr(processor, "resample", None)
    rescale = float(processor.rescale_factor) if getattr(processor, "do_rescale", True) else 1.0
    if getattr(processor, "do_normalize", True):
        mean, std = three(processor.image_mean, "image_mean"), three(processor.image_std, "image_std")
    else:
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    if min(std) <= 0 or rescale <= 0:
        raise ValueError(f"image_std {list(std)} and rescale_factor {rescale} must be > 0")
    return ImagePreprocessing(
        resize, resize_size, crop, int(resample) if resample is not None else int(Image.Resampling.BILINEAR), rescale,
        mean, std,
    )


def load_image_processor(name_or_path: str, owner: str) -> tuple[ImagePreprocessing, dict[str, Any]]:
    """Load a processor (a local directory, read with ``local_files_only``, or a hub name) and return its
    preprocessing and its record for checkpoints and export: ``{"class": <class name>, "config": to_dict()}``.
    Anything that cannot be loaded or followed is one ``ValueError`` line starting with ``owner``."""
    try:
        import transformers
    except ImportError:
        raise ValueError(
            f"{owner}: image_processor {name_or_path!r} needs transformers, which is not installed: {HF_EXTRA}"
        ) from None
    local = Path(name_or_path).expanduser()
    if not local.is_dir() and looks_like_a_path(name_or_path):
        raise ValueError(f"{owner}: image_processor directory {name_or_path!r} does not exist (or is not a directory)")
    kwargs: dict[str, Any] = {"local_files_only": True} if local.is_dir() else {}
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(
            str(local) if local.is_dir() else name_or_path, **kwargs
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"{owner}: image_processor {name_or_path!r} is neither a local directory with a Hugging Face image "
            f"processor nor a hub image processor that can be loaded ({reason})"
        ) from None
    try:
        preprocessing = derive_preprocessing(processor)
    except ValueError as err:
        raise ValueError(f"{owner}: image_processor {name_or_path!r}: {err}") from None
    return preprocessing, {"class": type(processor).__name__, "config": plain(processor.to_dict())}


class ImageProcessor:
    """The ``image_processor`` of an ``ImageFolderDataModule``: its preprocessing, from the processor or restored from
    a checkpoint.

    A local directory is read when the module is built; a hub name only when its preprocessing is first needed, so
    a checkpoint's data state restored first (``restore``: predict, the MLflow model) brings the preprocessing the
    model was trained with and nothing is fetched. A processor that cannot be loaded (a directory deleted since
    training, the hub out of reach) or followed is not an error until its preprocessing is needed
    (``preprocessing``), and then one line; a written ``image_size`` other than the processor's is one at once.

    Args:
        name_or_path: A local directory (written by ``save_pretrained``) or a hub name.
        owner: Name that starts error messages (the data module's).
        written_size: ``(height, width)`` written in the recipe, ``None`` when left at its default.
    """

    def __init__(self, name_or_path: str, owner: str, written_size: tuple[int, int] | None = None) -> None:
        self.name = name_or_path
        self.owner = owner
        self.written_size = written_size
        self.record: dict[str, Any] | None = None
        self.error: str | None = None
        self.loaded: ImagePreprocessing | None = None
        self.restored: ImagePreprocessing | None = None
        self.tried = False
        if self.is_local():
            self.load()

    def is_local(self) -> bool:
        """Whether the processor is a local directory (read without any network access)."""
        return Path(self.name).expanduser().is_dir()

    def load(self) -> None:
        """Load the processor once: its preprocessing and record, or the reason it cannot be used (``error``)."""
        if self.tried:
            return
        self.tried = True
        try:
            loaded, self.record = load_image_processor(self.name, self.owner)
        except ValueError as err:
            self.error = str(err)
            return
        self.check_size(loaded)
        self.loaded = loaded

    @property
    def preprocessing(self) -> ImagePreprocessing:
        """The preprocessing in use: the checkpoint's once restored, else the processor's (or its load error)."""
        if self.restored is not None:
            return self.restored
        self.load()
        if self.loaded is None:
            raise ValueError(self.error)
        return self.loaded

    def check_size(self, preprocessing: ImagePreprocessing) -> None:
        """A written ``image_size`` other than the processor's is an error."""
        if self.written_size is not None and self.written_size != preprocessing.image_size:
            raise ValueError(
                f"{self.owner}: image_size {list(self.written_size)} differs from the {list(preprocessing.image_size)} "
                f"of image_processor {self.name!r}: leave image_size out (the processor sets it)"
            )

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records: the preprocessing and ``{"class", "config"}`` of the processor (plain values)."""
        return {"preprocessing": self.preprocessing.to_state(), "image_processor": self.record}

    def restore(self, state: dict[str, Any]) -> None:
        """Use a checkpoint's preprocessing; a local processor that prepares images otherwise is an error (the model
        would see other inputs than it was trained on), so is a checkpoint trained without one."""
        if state.get("preprocessing") is None:
            raise ValueError(
                f"{self.owner}: the checkpoint was trained without an image_processor (its own resize and train "
                f"statistics), but this module has image_processor={self.name!r}; leave image_processor out"
            )
        saved = ImagePreprocessing.from_state(state["preprocessing"])
        if self.is_local():  # a local processor is compared with the checkpoint's; a hub one is not fetched
            self.load()
        if self.loaded is not None and self.loaded != saved:
            raise ValueError(
                f"{self.owner}: image_processor {self.name!r} prepares images with {self.loaded.describe()}, but the "
                f"checkpoint was trained with {saved.describe()}; use the image processor the model was trained with"
            )
        self.check_size(saved)
        self.restored = saved
        self.record = state.get("image_processor") or self.record


def plain(value: Any) -> Any:
    """``value`` with tuples as lists and other non-JSON values as strings (JSON-able, ``weights_only``-safe)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


__all__ = ["ImagePreprocessing", "ImageProcessor", "derive_preprocessing", "load_image_processor"]
