"""Image files for the image data modules: finding them, checking them, decoding and resizing them with Pillow."""

from __future__ import annotations

import base64
import binascii
import io
import os
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torch.utils.data import Dataset

from datamodules.file_paths import unreachable_reason

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MODES = {1: "L", 3: "RGB"}


def as_size(image_size: int | Sequence[int]) -> tuple[int, int]:
    """``(height, width)`` from one side length or a ``(height, width)`` pair; raises ``ValueError`` otherwise."""
    if isinstance(image_size, bool):
        raise ValueError(f"image_size must be an int or a (height, width) pair, got {image_size!r}")
    if isinstance(image_size, int):
        size = (image_size, image_size)
    else:
        size = tuple(image_size)  # type: ignore[assignment]
        if len(size) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in size):
            raise ValueError(f"image_size must be an int or a (height, width) pair of ints, got {image_size!r}")
    if min(size) < 1:
        raise ValueError(f"image_size must be >= 1, got {image_size!r}")
    return size  # type: ignore[return-value]


def is_image_file(name: str) -> bool:
    """A visible file with a .png, .jpg or .jpeg suffix in any case."""
    return not name.startswith(".") and name.lower().endswith(IMAGE_SUFFIXES)


def find_class_names(root: str | os.PathLike) -> list[str]:
    """Sorted names of the visible sub-folders of ``root`` (hidden ones such as ``.ipynb_checkpoints`` skipped)."""
    with os.scandir(root) as entries:
        return sorted(e.name for e in entries if e.is_dir() and not e.name.startswith("."))


def class_folders(root: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The class folders of ``root`` by the layout its real path has (a root that is a link is followed once):
    ``(class names, links back)``, the visible sub-folders (``find_class_names``) without the ones whose real path is
    the root itself or a folder above it (a link back to the root, as a second ``ln -s <folder> <link>`` puts inside
    the folder: it would hold every image again, as a class of its own), and those names. Raises ``ValueError`` when
    two class folders are one folder (its images would get two labels)."""
    real_root = os.path.realpath(root)
    names, back, reals = [], [], {}
    for name in find_class_names(root):
        real = os.path.realpath(os.path.join(root, name))
        if real == real_root or real_root.startswith(os.path.join(real, "")):
            back.append(name)
            continue
        if real in reals:
            raise ValueError(f"class folders {reals[real]!r} and {name!r} are the same folder ({real}): its images "
                             "would have two labels; remove one of them")
        reals[real] = name
        names.append(name)
    return names, back


def image_classes(root: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The class folders of the image folder ``root`` (``class_folders``: ``(class names, links back)``), with the
    errors of a root that is missing or not a folder, without class folders or with a single one (classification
    needs 2). ``ImageFolderDataModule`` and ``recipes pack`` read an image folder through it."""
    shown = str(root)
    if not os.path.exists(root):
        raise FileNotFoundError(f"root folder {shown!r} does not exist")
    if not os.path.isdir(root):
        raise ValueError(f"root {shown!r} is not a folder")
    classes, back = class_folders(root)
    if not classes:
        raise ValueError(
            f"no class folders under {shown!r}; expected one sub-folder of images per class "
            "(root/<class name>/*.png|*.jpg|*.jpeg)"
        )
    if len(classes) < 2:
        raise ValueError(
            f"found {len(classes)} class folder ({classes[0]!r}) under {shown!r}; classification needs at least 2"
        )
    return classes, back


def class_images(root: str | os.PathLike, class_names: Sequence[str]) -> tuple[list[str], list[int]]:
    """Every image of the class folders ``root/<class name>`` and its label (the class's index in ``class_names``):
    the classes in that order, each class's files sorted by path (``find_images``; a link never brings another
    class's images in). Raises ``FileNotFoundError`` for a class folder gone and ``ValueError`` for one without
    images. The order of an image folder's samples, for ``ImageFolderDataModule`` and ``recipes pack`` alike."""
    paths: list[str] = []
    labels: list[int] = []
    reals = [os.path.realpath(root), *(os.path.realpath(os.path.join(root, c)) for c in class_names)]
    for label, class_name in enumerate(class_names):
        folder = os.path.join(root, class_name)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"class folder {folder!r} no longer exists")
        files = find_images(folder, [r for r in reals if r != reals[label + 1]])  # none of another class
        if not files:
            raise ValueError(
                f"class folder {folder!r} has no images (looked for {', '.join(IMAGE_SUFFIXES)} in any case)"
            )
        paths.extend(files)
        labels.extend([label] * len(files))
    return paths, labels


def find_images(folder: str | os.PathLike, outside: Sequence[str] = ()) -> list[str]:
    """Paths of the image files under ``folder`` and its visible sub-folders, in sorted (deterministic) order.

    Links to folders are followed (a class folder may link to images kept elsewhere), but no folder is visited
    twice by its real path: a link back to a folder already walked (a loop, or a second link to the same images)
    is skipped, so every image is found once. Nor is a folder of ``outside`` (real paths: the image root and the
    other class folders) entered: a link to one never brings another class's images into this one.
    """
    found = []
    seen = {os.path.realpath(folder), *outside}
    for directory, subdirs, files in os.walk(folder, followlinks=True):
        kept = []
        for name in sorted(d for d in subdirs if not d.startswith(".")):
            real = os.path.realpath(os.path.join(directory, name))
            if real not in seen:
                seen.add(real)
                kept.append(name)
        subdirs[:] = kept
        found.extend(os.path.join(directory, f) for f in files if is_image_file(f))
    return sorted(found)


def find_images_to_predict(path: str) -> list[str]:
    """The image files to predict named by ``path``: every image under a folder (as ``find_images``), or one file.

    Paths start with ``path`` as given. Raises ``FileNotFoundError`` for a missing path and ``ValueError`` for a file
    that is not an image file or a folder without images.
    """
    expanded = os.path.expanduser(path)
    if os.path.isdir(expanded):
        found = find_images(expanded)
        if not found:
            raise ValueError(f"no images under {path!r} (looked for {', '.join(IMAGE_SUFFIXES)} in any case)")
        return found
    problem = unreachable_reason(expanded)
    if problem is not None:
        raise FileNotFoundError(f"predict_path: {problem} (expected a folder of images or an image file)")
    if not expanded.lower().endswith(IMAGE_SUFFIXES):
        raise ValueError(f"{path!r} is not an image file ({', '.join(IMAGE_SUFFIXES)}) or a folder of images")
    return [expanded]


class EncodedImage(bytes):
    """An image file's bytes as they are (encoded, not decoded) with the name they are known by (``name``: a
    shard row's path and its shard file), which a read error names instead of the number of bytes. Equal to, and
    decoded exactly as, the file's bytes; pickles with its name (for loader worker processes)."""

    name: str

    def __new__(cls, data: bytes, name: str) -> "EncodedImage":
        image = super().__new__(cls, data)
        image.name = name
        return image

    def __reduce__(self) -> tuple[Any, ...]:
        return (EncodedImage, (bytes(self), self.name))


def source_name(source: str | bytes) -> str:
    """How an error names an image: its file path, an ``EncodedImage``'s name, else ``of N bytes``."""
    if isinstance(source, EncodedImage):
        return source.name
    return f"of {len(source)} bytes" if isinstance(source, bytes) else str(source)


class NamedImageFile(io.BytesIO):
    """An ``EncodedImage``'s bytes as the file Pillow reads, shown by the image's name (Pillow's "cannot identify
    image file" error shows the file it was given)."""

    def __init__(self, image: EncodedImage) -> None:
        super().__init__(image)
        self.shown = image.name

    def __repr__(self) -> str:
        return repr(self.shown)


def opened(source: str | bytes) -> Any:
    """What Pillow's ``Image.open`` reads: the file path, or the bytes of an image file in memory."""
    if isinstance(source, EncodedImage):
        return NamedImageFile(source)
    return io.BytesIO(source) if isinstance(source, bytes) else source


def check_image(path: str | bytes) -> None:
    """Fail with the file's path (an ``EncodedImage``'s name) when Pillow cannot identify it or its structure is
    broken (no full decode)."""
    try:
        with Image.open(opened(path)) as image:
            image.verify()
    except Exception as err:  # Pillow raises OSError, SyntaxError, ValueError, struct.error, ... on bad files
        raise ValueError(f"cannot read image {source_name(path)}: {type(err).__name__}: {err}") from err


def missing(value: Any) -> bool:
    """A table cell without a value (``None``, NaN)."""
    return value is None or (isinstance(value, float) and value != value)


def decode_base64_image(value: Any, row: int) -> bytes:
    """The image file bytes of a base64 string (or bytes), checked to open; a ``ValueError`` naming ``row``."""
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError) as err:
        raise ValueError(f"row {row} of the 'image' column is not base64-encoded bytes ({err})") from None
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except Exception as err:  # as check_image: Pillow raises many kinds on bad bytes
        reason = f"{type(err).__name__}: {err}"
        raise ValueError(f"row {row} of the 'image' column is not an image file ({reason})") from None
    return data


def base64_thumbnail(path: str | bytes, side: int = 64) -> str:
    """An image file (or an image file's bytes) shrunk to fit ``side`` x ``side`` (aspect ratio kept), as base64 of
    PNG bytes: a small example of the ``image`` column whatever the size of the file."""
    with Image.open(opened(path)) as image:
        image = to_eight_bits(image)
        if image.mode not in ("1", "L", "LA", "P", "RGB", "RGBA"):  # CMYK, YCbCr, ...: not PNG modes
            image = image.convert("RGB")
        image.thumbnail((side, side))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def frame_images(frame: Any) -> tuple[list[str | bytes], list[str | None]]:
    """The images of a DataFrame's rows and their ids: a row's ``image`` (base64-encoded image file bytes, decoded
    in memory) or else its ``path`` (an image file, checked to open); the id is the row's ``path`` (``None`` when it
    has only an image). One ``ValueError`` line names the first bad row."""
    columns = [c for c in ("path", "image") if c in frame.columns]
    if not columns:
        raise ValueError(
            "the table needs a 'path' column of image files or an 'image' column of base64-encoded image bytes"
        )
    paths = frame["path"].tolist() if "path" in columns else [None] * len(frame)
    images = frame["image"].tolist() if "image" in columns else [None] * len(frame)
    sources: list[str | bytes] = []
    for row, (path, image) in enumerate(zip(paths, images)):
        if not missing(image):
            sources.append(decode_base64_image(image, row))
        elif not missing(path):
            check_image(str(path))
            sources.append(str(path))
        else:
            raise ValueError(f"row {row} has neither a 'path' nor an 'image'")
    return sources, [None if missing(path) else str(path) for path in paths]


#: Pillow modes of more than 8 bits per pixel that ``Image.convert`` would clip to 8 bits (every value above 255
#: becomes 255: a 16-bit PNG turns white), with the largest value of their range.
HIGH_DEPTH_MODES = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535}


def to_eight_bits(image: Image.Image) -> Image.Image:
    """A high-depth grey image (16-bit PNG/TIFF: modes ``I;16*``, ``I``) scaled to 8 bits ("L", round(v / 257)),
    so it gives the tensor its 8-bit version gives; other images unchanged. 32-bit "I" images are read as 16-bit
    data (what PNG and TIFF files hold); values beyond 65535 saturate."""
    top = HIGH_DEPTH_MODES.get(image.mode)
    if top is None:
        return image
    values = np.asarray(image, dtype=np.float64)
    scaled = np.clip(np.round(values * (255.0 / top)), 0, 255).astype(np.uint8)
    return Image.fromarray(scaled, mode="L")


def read_image(
    path: str | bytes, size: tuple[int, int], channels: int, prepare: Callable[[Image.Image], np.ndarray] | None = None
) -> Tensor:
    """One image file (or an image file's bytes) as a uint8 tensor ``(channels, height, width)``: converted to
    "L"/"RGB", bilinear resize; with ``prepare`` (an image processor's ``ImagePreprocessing``) that instead.

    The file is only read. Alpha is dropped (not composited; ``prepare`` composites it onto white); EXIF orientation
    is not applied.
    """
    height, width = size
    try:
        with Image.open(opened(path)) as image:
            if prepare is not None:
                array = prepare(to_eight_bits(image))
            else:
                image = to_eight_bits(image).convert(MODES[channels])
                if image.size != (width, height):
                    image = image.resize((width, height), Image.Resampling.BILINEAR)
                array = np.array(image, dtype=np.uint8)
    except Exception as err:
        raise ValueError(f"cannot read image {source_name(path)}: {type(err).__name__}: {err}") from err
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


class DecodedImages(Dataset):
    """The files ``paths`` decoded and resized to uint8 ``(C, H, W)`` tensors; used to stream or cache a split.

    Args:
        paths: Image files.
        size: Target ``(height, width)``.
        channels: 1 (grayscale) or 3 (RGB).
        prepare: An image processor's preprocessing (``datamodules.image_processor.ImagePreprocessing``), used
            instead of the conversion and bilinear resize.
    """

    def __init__(
        self, paths: Sequence[str | bytes], size: tuple[int, int], channels: int,
        prepare: Callable[[Image.Image], np.ndarray] | None = None,
    ) -> None:
        self.paths = list(paths)
        self.size = size
        self.channels = channels
        self.prepare = prepare

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Tensor:
        return read_image(self.paths[index], self.size, self.channels, self.prepare)
