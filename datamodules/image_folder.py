"""Images in one sub-folder per class (``root/<class name>/*.png|*.jpg|*.jpeg``), decoded and resized with Pillow."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, ClassVar, Iterator, Literal, Sequence

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from datamodules.base import BaseDataModule
from datamodules.batch_augmentation import BatchAugmentation, BatchAugmented
from datamodules.image_folder_dataset import ImageFolderDataset
from datamodules.image_processor import ImagePreprocessing, ImageProcessor
from datamodules.image_files import (
    MODES,
    DecodedImages,
    as_size,
    check_image,
    class_images,
    image_classes,
    base64_thumbnail,
    find_images_to_predict,
    frame_images,
    read_image,  # noqa: F401  (re-exported: datamodules.image_folder.read_image)
)
from datamodules.image_shards import ShardRows, is_image_shards, read_shards, shard_files, shard_labels

DECODE_BATCH = 64  # images per transfer when decoding with worker processes


class ImageFolderDataModule(BatchAugmented, BaseDataModule):
    """Classify images stored as ``root/<class name>/<image>`` (.png, .jpg, .jpeg in any case), read with Pillow.

    Class names are the sorted sub-folder names and a label is the index of its folder in that list. Images in
    nested folders of a class folder belong to that class; hidden files and folders (``.*``) and other file
    types are skipped. Every file is checked to open before the split; the train images are decoded once to
    compute per-channel mean and std (of pixel values in [0, 1], after the resize), which every split is
    normalized with. Mean, std and class names are saved in checkpoints and restored from them. Images are
    converted to grayscale ("L") or RGB (alpha dropped) and resized with bilinear filtering, ignoring the aspect
    ratio. The user's files are only read.

    ``root`` may also be image shards (``recipes pack``'s Parquet files: the images' encoded bytes, label and path;
    ``datamodules.image_shards``): the samples are then the shards' rows, with the classes, sample order, split,
    decoding, statistics and predictions (identified by the stored relative path) of the folder they were packed
    from. The module then holds every image's encoded bytes in memory (a folder's: only its paths) and decodes them
    as it decodes files (``cache``: once, during setup).

    The other arguments (``batch_size``, ``val_fraction``, ``test_fraction``, ``seed``, the loader options) are
    ``BaseDataModule``'s, passed on through ``**kwargs``; the splits are per class. ``num_workers`` processes decode
    and augment the images (and compute the statistics); 2-8 is typical for files on disk.

    Args:
        root: Folder with one sub-folder of images per class, or image shards from ``recipes pack`` (a folder of
            its Parquet files, or one of them).
        image_size: Side of the square images fed to the model, or their (height, width).
        channels: 1 converts every image to grayscale, 3 to RGB.
        augment: Randomly crop (after zero padding) and horizontally flip the train images on every read; val
            and test images are never augmented.
        crop_padding: Pixels of zero (black) padding on each side before the random crop; 0 disables the crop.
        cache: Hold the decoded, resized images of every split in memory (uint8; decoded once, during setup)
            instead of reading the files on every access.
        predict_path: New images that ``predict`` classifies: a folder (every image file under it, in its
            sub-folders too, sorted by path; hidden files and folders skipped, as in training) or one image file.
            They are decoded, resized and normalized exactly as the val and test images, with the mean, std and
            class names the model was trained with (restored from the checkpoint). A prediction's ``path`` is the
            file's path as found from ``predict_path``. Default: predict the test split (the val split without
            one), also identified by path.
        batch_augmentation: ``datamodules.BatchAugmentation``: random resized crop, flip, colour jitter and
            optionally mixup/cutmix of whole train batches on the training device (kornia, ``loopwise[vision]``);
            its position is in the checkpoint, so a resumed run augments as the uninterrupted one.
        image_processor: A Hugging Face image processor (local directory or hub name; ``loopwise[hf]``) whose
            preprocessing replaces the resize and the train statistics: RGB, its resize rule, filter, center crop,
            rescale, mean and std, as its PIL implementation does; ``image_size`` and ``channels`` are the
            processor's (leave them out). The checkpoint stores that preprocessing: predict and the MLflow model
            never need the processor again (the checkpoint's is used; one that loads and differs is an error).
    """

    save_init_arguments = True
    #: Predictions are identified by the image file's path.
    id_name: ClassVar[str] = "path"

    def __init__(
        self,
        root: str,
        image_size: int | tuple[int, int] = 32,
        channels: Literal[1, 3] = 3,
        augment: bool = False,
        crop_padding: int = 4,
        cache: bool = False,
        predict_path: str | None = None,
        batch_augmentation: BatchAugmentation | None = None,
        image_processor: str | None = None,
        **kwargs: Any,
    ) -> None:
        name = type(self).__name__
        try:
            size = as_size(image_size)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        if channels not in MODES:
            raise ValueError(f"{name}: channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")
        if image_processor is not None and channels != 3:
            raise ValueError(f"{name}: channels {channels} with image_processor: its images are RGB; leave it out")
        self.image_processor = image_processor
        written = None if image_size == 32 else size  # the default counts as not written (jsonargparse cannot tell)
        self.processor = ImageProcessor(image_processor, name, written) if image_processor is not None else None
        if crop_padding < 0:
            raise ValueError(f"{name}: crop_padding must be >= 0, got {crop_padding}")
        super().__init__(**kwargs)
        self.root = root
        self._image_size = size
        self.channels = int(channels)
        self.augment = augment
        self.crop_padding = crop_padding
        self.cache = cache
        self.predict_path = predict_path
        self.batch_augmentation = batch_augmentation
        self.sample_paths: list[str] = []  # every image of the folder, by sample number (after setup)
        found = Path(os.path.expanduser(root))
        #: the Parquet files when ``root`` is image shards (``recipes pack``), ``None`` for an image folder
        self.shards: list[Path] | None = self.find_shards(found) if is_image_shards(found) else None
        self.class_names: list[str] = (
            self.discover_labels(self.shards, found) if self.shards is not None else self.discover_classes(found)
        )
        self._shard_rows: ShardRows | None = None
        self.mean: Tensor | None = None
        self.std: Tensor | None = None
        self._restored = False
        self._train_images: tuple[list[str], Tensor] | None = None

    # --- description ----------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        """Number of classes (class sub-folders)."""
        return len(self.class_names)

    @property
    def image_size(self) -> tuple[int, int]:
        """``(height, width)`` of the images fed to the model (the image processor's with one)."""
        return self.processor.preprocessing.image_size if self.processor is not None else self._image_size

    @property
    def prepare(self) -> ImagePreprocessing | None:
        """The image processor's preprocessing (``None`` without one); its load error when none can be had."""
        return self.processor.preprocessing if self.processor is not None else None

    @property
    def in_channels(self) -> int:
        """Channels of every image: 1 (grayscale) or 3 (RGB)."""
        self.prepare  # a processor that could not be loaded (and no checkpoint brought its preprocessing): error
        return self.channels

    @property
    def in_features(self) -> int:
        """Values per image, ``channels * height * width`` (the input width of an MLP)."""
        return self.channels * self.image_size[0] * self.image_size[1]

    def discover_classes(self, root: Path) -> list[str]:
        """Sorted class folder names under ``root``, with errors for a missing root and too few classes."""
        name = type(self).__name__
        try:
            classes, back = image_classes(root)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{name}: {err}") from None
        if back:
            warnings.warn(f"{name}: {', '.join(map(repr, back))} under {str(root)!r} links back to the image root "
                          f"({os.path.realpath(root)}): not a class, skipped (a second `ln -s <folder> <link>` puts "
                          "such a link inside the folder; remove it)", stacklevel=3)
        return classes

    def find_shards(self, root: Path) -> list[Path]:
        """The Parquet files of image shards ``root`` (one file, or a folder's, sorted by name)."""
        try:
            return shard_files(root)
        except FileNotFoundError as err:
            raise FileNotFoundError(f"{type(self).__name__}: {err}") from None

    def discover_labels(self, files: list[Path], root: Path) -> list[str]:
        """The sorted distinct labels of image shards (their ``label`` column only), with the errors of a file that
        is not an image shard and of too few classes."""
        name = type(self).__name__
        try:
            labels = shard_labels(files)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
        if len(labels) < 2:
            raise ValueError(
                f"{name}: the image shards {str(root)!r} hold {len(labels)} class{'' if len(labels) == 1 else 'es'} "
                f"({', '.join(map(repr, labels)) or 'no rows'}); classification needs at least 2"
            )
        return labels

    # --- BaseDataModule hooks -------------------------------------------------------------------------------
    def load(self) -> tuple[list[str] | list[bytes], Tensor]:
        """All image paths (sorted per class) and their labels; every class must have images that open. For image
        shards, the images' encoded bytes (``EncodedImage``) in the same order (by label, then path)."""
        if self.shards is not None:
            return self.load_shards()
        name = type(self).__name__
        try:
            paths, labels = class_images(Path(os.path.expanduser(self.root)), self.class_names)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{name}: {err}") from None
        self.check_images(paths)
        self.sample_paths = list(paths)
        return paths, torch.tensor(labels, dtype=torch.long)

    def shard_rows(self) -> ShardRows:
        """The rows of the image shards, read once (their encoded images are kept: the module's samples)."""
        if self._shard_rows is None:
            assert self.shards is not None
            try:
                rows = read_shards(self.shards)
            except ValueError as err:
                raise ValueError(f"{type(self).__name__}: {err}") from None
            if sorted(set(rows.labels)) != self.class_names:
                raise ValueError(
                    f"{type(self).__name__}: the image shards {self.root!r} changed since the module was built: "
                    f"their labels are now {sorted(set(rows.labels))}, not {self.class_names}"
                )
            self.check_images(rows.images)
            self._shard_rows = rows
        return self._shard_rows

    def load_shards(self) -> tuple[list[bytes], Tensor]:
        """The images of the shards (encoded bytes, named by path and shard) and their labels, in sample order."""
        rows = self.shard_rows()
        index = {name: i for i, name in enumerate(self.class_names)}
        self.sample_paths = list(rows.paths)
        return list(rows.images), torch.tensor([index[label] for label in rows.labels], dtype=torch.long)

    def check_images(self, paths: Sequence[str | bytes]) -> None:
        """Fail, naming the file, on the first of ``paths`` (or images' bytes) that Pillow cannot read."""
        for path in paths:
            try:
                check_image(path)
            except ValueError as err:
                raise ValueError(f"{type(self).__name__}: {err}") from None

    def sample_id(self, number: int) -> Any:
        """The path of the folder's image ``number`` (predictions of a split are identified by path)."""
        return self.sample_paths[number]

    def decode(self, paths: Sequence[str]) -> Iterator[Tensor]:
        """Iterate the decoded uint8 images of ``paths`` in order, using ``num_workers`` worker processes."""
        loader = DataLoader(
            DecodedImages(paths, self.image_size, self.channels, self.prepare),
            batch_size=DECODE_BATCH,
            num_workers=self.num_workers if len(paths) > DECODE_BATCH else 0,
        )
        for batch in loader:
            yield from batch

    def decode_all(self, paths: Sequence[str]) -> Tensor:
        """The decoded uint8 images of ``paths`` as one ``(N, C, H, W)`` tensor."""
        out = torch.empty((len(paths), self.channels, *self.image_size), dtype=torch.uint8)
        for i, image in enumerate(self.decode(paths)):
            out[i] = image
        return out

    def fit_preprocessing(self, train_paths: list[str]) -> None:
        """Per-channel mean and std of the train images (exact integer sums), decoding each image once.

        Statistics restored by ``load_state_dict`` are kept, so a restored model sees the normalization it was
        trained with.
        """
        self._train_images = None
        if self.processor is not None:  # the processor's normalization, no statistics pass
            self.mean, self.std = (torch.tensor(v) for v in self.processor.preprocessing.normalization())
        compute = self.processor is None and not (self._restored and self.mean is not None)
        if not compute and not self.cache:
            return
        cached = torch.empty((len(train_paths), self.channels, *self.image_size), dtype=torch.uint8)
        total = torch.zeros(self.channels, dtype=torch.int64)
        squares = torch.zeros(self.channels, dtype=torch.int64)
        for i, image in enumerate(self.decode(train_paths)):
            if self.cache:
                cached[i] = image
            if compute:
                values = image.reshape(self.channels, -1).long()
                total += values.sum(dim=1)
                squares += (values * values).sum(dim=1)
        if self.cache:
            self._train_images = (list(train_paths), cached)
        if compute:
            count = len(train_paths) * self.image_size[0] * self.image_size[1]
            mean = total.double() / count
            var = (squares.double() / count - mean * mean).clamp_min(0.0)
            std = var.sqrt()
            std = torch.where(std > 1e-6, std, torch.full_like(std, 255.0))  # constant channel: only centre it
            self.mean = (mean / 255.0).float()
            self.std = (std / 255.0).float()

    def make_dataset(self, split: str, paths: list[str], targets: Tensor) -> ImageFolderDataset:
        assert self.mean is not None and self.std is not None
        images = None
        if self.cache:
            if split == "train" and self._train_images is not None and self._train_images[0] == list(paths):
                images = self._train_images[1]
            else:
                images = self.decode_all(paths)
        if split == "train":
            self._train_images = None
        return ImageFolderDataset(
            paths,
            targets,
            self.image_size,
            self.channels,
            self.mean,
            self.std,
            augment=self.augment and split == "train",
            crop_padding=self.crop_padding,
            images=images,
            prepare=self.prepare,
        )

    # --- new data -------------------------------------------------------------------------------------------------
    def predicts_new_data(self) -> bool:
        return self.predict_path is not None

    def new_data(self) -> tuple[Dataset, list[Any]] | None:
        """The images of ``predict_path`` (sorted by path) prepared as val/test images, with their paths as ids."""
        if self.predict_path is None:
            return None
        if self.mean is None or self.std is None:
            self.setup()  # no checkpoint state: the statistics of the train split (the ones a fit computes)
        assert self.mean is not None and self.std is not None
        try:
            paths = find_images_to_predict(self.predict_path)
        except (ValueError, FileNotFoundError) as err:
            raise type(err)(f"{type(self).__name__}: {err}") from None
        self.check_images(paths)
        images = self.decode_all(paths) if self.cache else None
        dataset = ImageFolderDataset(
            paths, None, self.image_size, self.channels, self.mean, self.std, images=images, prepare=self.prepare
        )
        return dataset, list(paths)

    def frame_data(self, frame: Any) -> tuple[Dataset, list[Any]]:
        """Images of a DataFrame prepared as val/test images: files named in a ``path`` column, or an ``image``
        column of base64-encoded image file bytes (what ``mlflow models serve`` clients send in JSON), decoded in
        memory (a row may give either; with both, the image is read and the path is its id)."""
        if self.mean is None or self.std is None:
            self.setup()
        try:
            sources, ids = frame_images(frame)
        except ValueError as err:
            raise ValueError(f"{type(self).__name__}: {err}") from None
        dataset = ImageFolderDataset(
            sources, None, self.image_size, self.channels, self.mean, self.std, prepare=self.prepare
        )
        return dataset, ids

    def raw_examples(self, count: int = 5) -> Any:
        """The first ``count`` images of the train data as a DataFrame (the MLflow model's input example): the last
        one, shrunk to at most 64x64, as base64 PNG bytes in an ``image`` column, the others by ``path`` (both
        columns optional in the signature)."""
        import pandas as pd

        if self.shards is not None:  # no file to name: every row is an image; its stored path (the last none) its id
            rows = self.shard_rows()
            paths: list[str | None] = list(rows.paths[:count])
            images = [base64_thumbnail(image) for image in rows.images[:count]]
            return pd.DataFrame({"path": paths[:-1] + [None], "image": images})
        paths = list(self.load()[0])[:count]
        if len(paths) < 2:
            return pd.DataFrame({"path": paths})
        image = base64_thumbnail(paths[-1])
        return pd.DataFrame({"path": paths[:-1] + [None], "image": [None] * (len(paths) - 1) + [image]})

    # --- checkpoint state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Class names and, after setup, the train mean/std (plain lists, safe for ``weights_only`` loading)."""
        state: dict[str, Any] = {"class_names": list(self.class_names)}
        if self.mean is not None and self.std is not None:
            state["mean"] = self.mean.tolist()
            state["std"] = self.std.tolist()
        if self.processor is not None and (self.processor.loaded or self.processor.restored):
            state.update(self.processor.state_dict())  # the preprocessing: predict never needs the processor again
        state.update(self.batch_augmentation_state())
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the normalization of a checkpoint; its class names must be those found under ``root``."""
        name = type(self).__name__
        names = list(state_dict.get("class_names", self.class_names))
        if names != self.class_names:
            holds = "has class folders" if self.shards is None else "holds the labels"
            raise ValueError(
                f"{name}: the checkpoint was trained on classes {names} but {self.root!r} {holds} "
                f"{self.class_names}; labels would not match the model's outputs"
            )
        self.load_batch_augmentation_state(state_dict)
        if self.processor is not None or state_dict.get("preprocessing") is not None:
            if self.processor is None:
                raise ValueError(
                    f"{name}: the checkpoint was trained with image_processor {state_dict.get('image_processor')}; "
                    "set image_processor to the processor the model was trained with"
                )
            self.processor.restore(state_dict)
        if state_dict.get("mean") is None or state_dict.get("std") is None:
            return
        mean = torch.tensor(state_dict["mean"], dtype=torch.float32)
        std = torch.tensor(state_dict["std"], dtype=torch.float32)
        if mean.shape != (self.channels,) or std.shape != (self.channels,) or not bool((std > 0).all()):
            raise ValueError(
                f"{name}: the checkpoint's normalization (mean {state_dict['mean']}, std {state_dict['std']}) does "
                f"not fit channels={self.channels}"
            )
        self.mean, self.std, self._restored = mean, std, True
        for dataset in self.datasets.values():
            if isinstance(dataset, ImageFolderDataset):
                dataset.set_normalization(mean, std)
