"""The images ``recipes pack`` packs: an image folder read as ``ImageFolderDataModule`` reads it.

The classes and the order of the images are the data module's own (``datamodules.image_files.image_classes`` and
``class_images``: classes sorted, each class's files sorted by path, nested folders in their class, hidden files and
folders skipped), so the rows of the shards are the module's samples in its order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from datamodules.image_files import EncodedImage, check_image, class_images, image_classes
from recipes.pack.errors import PackError


@dataclass(frozen=True)
class FolderImage:
    """One image of the folder: its file (as found under the folder given), class name and relative path."""

    file: str
    label: str
    path: str


@dataclass(frozen=True)
class ImageSource:
    """An image folder's classes and images (in sample order), and the sub-folders skipped as links back to it."""

    root: str
    class_names: list[str]
    images: list[FolderImage]
    links_back: list[str]


def relative_path(file: str, root: str) -> str:
    """``file``'s path under ``root``, ``/``-separated (the shards' ``path``)."""
    return os.path.relpath(file, root).replace(os.sep, "/")


def image_source(folder: str) -> ImageSource:
    """The classes and images of the image folder ``folder``; a ``PackError`` line for a folder that is missing, not
    a folder, without class folders (or with one) or with a class folder without images."""
    root = os.path.expanduser(folder)
    if not os.path.exists(root):
        raise PackError(f"the image folder {folder!r} does not exist")
    if not os.path.isdir(root):
        raise PackError(f"{folder!r} is not a folder (expected an image folder: <folder>/<class name>/*.png|*.jpg|"
                        "*.jpeg)")
    try:
        classes, back = image_classes(root)
        files, labels = class_images(root, classes)
    except (ValueError, FileNotFoundError) as err:
        raise PackError(str(err)) from None
    images = [FolderImage(file, classes[label], relative_path(file, root)) for file, label in zip(files, labels)]
    return ImageSource(root, classes, images, back)


def read_image_file(image: FolderImage) -> bytes:
    """The bytes of ``image``'s file, checked to open as the data module checks a file (Pillow identifies it and its
    structure holds; no full decode); a ``PackError`` naming the file otherwise."""
    try:
        with open(image.file, "rb") as handle:
            data = handle.read()
    except OSError as err:
        raise PackError(f"cannot read image {image.file}: {err.strerror or err}") from None
    try:
        check_image(EncodedImage(data, image.file))
    except ValueError as err:
        raise PackError(str(err)) from None
    return data


__all__ = ["FolderImage", "ImageSource", "image_source", "read_image_file", "relative_path"]
