"""What the ``recipes`` command may ask of a data module: the one written contract between the recipes and the data.

A recipe's data is any ``LightningDataModule``. The loopwise data modules (``datamodules.BaseDataModule`` and its
subclasses) implement this contract; your own data module implements what it wants of it, by name, with no base
class to derive from: each member below is a small ``typing.Protocol`` (runtime checkable), and the recipes read a
member only through the function next to it, which gives the documented default to a data module without it. A
plain ``LightningDataModule`` that implements none of it trains, evaluates and predicts in a recipe as it is.

Members (what, when the recipes ask, default without it):

* sizes (``DATA_SIZES``: ``num_classes``, ``in_features``, ``out_features``, ``in_channels``, ``vocab_size``,
  ``max_length``, ``block_size``, ``image_size`` (height, width), ``class_names``, ``numeric_features`` (the leading
  scaled numeric positions of a tabular sample, for numerical embeddings)): read when the classes are built,
  to fill the task's and the network's arguments of the same name (``data_size``). Default: the recipe's own value.
* ``class_names`` (``ClassNames``): the names of the classes, on the confusion-matrix figure. Default: class ids.
* ``batch_size`` (``BatchSize``): the run's ``batch_size`` param, and the training plan's batch size when a batch
  sampler decides the batches. Default: not recorded.
* ``split_sizes`` (``SplitSizes``): samples per split, the run's ``<split>_samples`` params. Default: none.
* ``datasets`` (``SplitDatasets``): the datasets by split name, for the dataset inputs of the MLflow run and the
  loop doctor's leakage check. Default: the datasets of the trainer's loaders (doctor), none (dataset inputs).
* ``split_rows`` (``SplitRows``): the source's row (sample) numbers in each split, after ``setup``: which of this
  run's validation and test rows an ``init_from`` checkpoint trained on. Default: rows compared by content.
* ``path`` or ``root`` (``DataFile``, ``DataFolder``): the file or folder the data is read from, the source (and
  its digest) of the run's dataset inputs. Default: the data module's class and settings.
* ``predicts_new_data()``, ``check_new_data()``, ``new_data()`` (``PredictsNewData``): whether ``predict`` reads
  new data rather than a split, reading it before the run is made (a bad file is an error at once), and the new
  data itself (its dataset input). Default: a split is predicted.
* ``prediction_ids`` and ``id_name`` (``PredictionIds``, ``IdName``): one id per sample of the last
  ``predict_dataloader`` and what it is, the first column of the predictions CSV. Default: ``row`` 0..n-1.
* ``frame_data(frame)``, ``inference_loader(dataset)``, ``raw_examples(count)`` (``TableRows``): raw rows of a
  table preprocessed as at training time, the loader over them, and a few raw rows: the MLflow model of a run
  predicts with them, and its input example is ``raw_examples``. Default: no input example.
* ``check_rows(frame)`` (``ChecksRows``): the MLflow model's check of raw rows before it predicts any, a
  ``ValueError`` naming every bad row and column at once. Default: ``frame_data``'s own checks.
* ``prediction_notes(frame=None)`` (``PredictionNotes``): extra columns of the predictions (name -> one value per
  row) for raw rows, or for the new data of the last ``predict_dataloader`` (``TabularDataModule``:
  ``unknown_categories``). Default: none.
* ``state_dict()`` and ``load_state_dict(state)`` (``DataState``, Lightning's own hooks): the data's fitted state
  (encodings, vocabularies, class names), saved in every checkpoint and loaded before any size is read when a
  checkpoint is evaluated. Default: nothing restored.
* ``source_digest`` (``SourceDigest``): the data module's own digest of its source, the run's dataset inputs' and
  the data guard's, instead of the bytes of ``path``/``root`` (a streamed table: its Parquet metadata). Default: the
  bytes are read (once per command).
* ``loader_settings`` and ``new_data_settings`` on the class (``SettingsOutsideSplit``): constructor arguments
  that never choose which rows a split holds (how rows are batched and moved; the new data ``predict`` reads).
  The data guard compares every other setting of an evaluation with the checkpoint's (Lightning's ``hparams``,
  saved as ``datamodule_hyper_parameters``). Default: ``LOADER_SETTINGS`` and ``NEW_DATA_SETTINGS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

#: The sizes a recipe links from the data module to the task's and network's arguments of the same name.
DATA_SIZES = (
    "num_classes", "in_features", "out_features", "in_channels", "vocab_size", "max_length", "block_size", "image_size",
    "class_names", "numeric_features",
)
#: Default ``loader_settings``: they change how rows are batched and moved, never which rows a split holds.
LOADER_SETTINGS = frozenset({"batch_size", "num_workers", "pin_memory", "drop_last", "device_resident"})
#: Default ``new_data_settings``: a ``predict`` with one of them set predicts that data, not a split.
NEW_DATA_SETTINGS = ("predict_path", "prompt_path")


@runtime_checkable
class ClassNames(Protocol):
    """``class_names``: one name per class, in class-id order (the confusion-matrix figure's labels)."""

    class_names: Sequence[Any]


@runtime_checkable
class BatchSize(Protocol):
    """``batch_size``: samples per batch (the run's ``batch_size`` and ``effective_batch_size`` params)."""

    batch_size: int


@runtime_checkable
class SplitSizes(Protocol):
    """``split_sizes``: samples per split after ``setup`` (the run's ``<split>_samples`` params)."""

    split_sizes: Mapping[str, int]


@runtime_checkable
class SplitDatasets(Protocol):
    """``datasets``: the dataset of each split by name (``train``, ``val``, ``test``), hashed by the loop doctor's
    leakage check and recorded as the run's dataset inputs."""

    datasets: Mapping[str, Dataset]


@runtime_checkable
class SplitRows(Protocol):
    """``split_rows``: the numbers of each split's rows in the source (the file's row positions, or the generated
    samples' numbers), by split name; the same numbers name the same rows of the same source."""

    split_rows: Mapping[str, Any]


@runtime_checkable
class DataFile(Protocol):
    """``path``: the file the data is read from (the source of the run's dataset inputs, with its digest)."""

    path: str | Path


@runtime_checkable
class DataFolder(Protocol):
    """``root``: the folder the data is read from (the source of the run's dataset inputs, with its digest)."""

    root: str | Path


@runtime_checkable
class PredictsNewData(Protocol):
    """``predicts_new_data()``: whether ``predict_dataloader`` reads new data rather than a split; then
    ``check_new_data()`` reads it before the run is made (a bad file is an error at once) and ``new_data()`` is
    that data (dataset, ids), recorded as the run's ``predict`` dataset input."""

    def predicts_new_data(self) -> bool: ...

    def check_new_data(self) -> None: ...

    def new_data(self) -> tuple[Dataset, list[Any]] | None: ...


@runtime_checkable
class PredictionIds(Protocol):
    """``prediction_ids``: one id per sample of the last ``predict_dataloader``, in order (the predictions CSV's
    first column); ignored when their number is not the number of predictions."""

    prediction_ids: Sequence[Any]


@runtime_checkable
class IdName(Protocol):
    """``id_name``: what a prediction's id is (``row``, ``path``): the name of the CSV's id column."""

    id_name: str


@runtime_checkable
class TableRows(Protocol):
    """Raw rows of a table: ``frame_data(frame)`` preprocesses a pandas DataFrame as at training time into
    (dataset, ids), ``inference_loader(dataset)`` keeps their order, ``raw_examples(count)`` is a few raw rows (or
    ``None``). The run's MLflow model predicts with them; ``raw_examples`` is its input example and signature."""

    def frame_data(self, frame: Any) -> tuple[Dataset, list[Any]]: ...

    def inference_loader(self, dataset: Dataset) -> DataLoader: ...

    def raw_examples(self, count: int = 5) -> Any: ...


@runtime_checkable
class ChecksRows(Protocol):
    """``check_rows(frame)``: raise one ``ValueError`` naming every value of raw rows (a pandas DataFrame) that
    cannot be predicted, by row and column, before any is."""

    def check_rows(self, frame: Any) -> None: ...


@runtime_checkable
class PredictionNotes(Protocol):
    """``prediction_notes(frame=None)``: extra columns after the task's in the predictions (name -> one value per
    row) of raw rows, or (``None``) of the new data the last ``predict_dataloader`` read; ``{}``: none."""

    def prediction_notes(self, frame: Any = None) -> dict[str, list[Any]]: ...


@runtime_checkable
class DataState(Protocol):
    """Lightning's ``state_dict()`` and ``load_state_dict(state)``: the fitted state of the data, saved in the
    checkpoint; an evaluated checkpoint's state is loaded before the sizes are read and the data is prepared."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


@runtime_checkable
class SettingsOutsideSplit(Protocol):
    """Class attributes: ``loader_settings``, the constructor arguments that change only how rows are batched and
    moved, and ``new_data_settings``, those that name new data to predict. The data guard compares every other
    setting of an evaluation with the checkpoint's; a ``predict`` with a new-data setting is not guarded."""

    loader_settings: ClassVar[frozenset[str]]
    new_data_settings: ClassVar[tuple[str, ...]]


# --- what the recipes call: one function per member, with its default ---------------------------------------------
def data_size(datamodule: Any, name: str, default: Any = None) -> Any:
    """The data module's size ``name`` (one of ``DATA_SIZES``), ``default`` when it has none."""
    if name not in DATA_SIZES:
        raise KeyError(f"{name!r} is not a size of the recipe contract {DATA_SIZES}")
    return getattr(datamodule, name, default)


def class_names_of(datamodule: Any) -> Sequence[Any] | None:
    """The data module's ``class_names`` (default ``None``)."""
    return datamodule.class_names if isinstance(datamodule, ClassNames) else None


def batch_size_of(datamodule: Any) -> int | None:
    """The data module's ``batch_size`` (default ``None``)."""
    return datamodule.batch_size if isinstance(datamodule, BatchSize) else None


def split_sizes_of(datamodule: Any) -> Mapping[str, int]:
    """The data module's ``split_sizes`` (default: none)."""
    return (datamodule.split_sizes if isinstance(datamodule, SplitSizes) else None) or {}


def split_datasets_of(datamodule: Any) -> Mapping[str, Dataset] | None:
    """The data module's ``datasets`` by split (default ``None``)."""
    return datamodule.datasets if isinstance(datamodule, SplitDatasets) else None


def split_rows_of(datamodule: Any) -> Mapping[str, Tensor] | None:
    """The data module's ``split_rows`` as int64 tensors (default ``None``: it does not say which rows)."""
    if not isinstance(datamodule, SplitRows) or not datamodule.split_rows:
        return None
    return {split: torch.as_tensor(rows, dtype=torch.int64) for split, rows in datamodule.split_rows.items()}


def source_paths_of(datamodule: Any) -> list[Any]:
    """The data module's ``path`` and ``root``, those it has, in that order (the caller checks they exist)."""
    found = [datamodule.path] if isinstance(datamodule, DataFile) else []
    return found + ([datamodule.root] if isinstance(datamodule, DataFolder) else [])


@runtime_checkable
class SourceDigest(Protocol):
    """``source_digest``: the data module's own digest of its source, for a source too large to read per command (a
    streamed table: its Parquet metadata and row-group statistics), used instead of the bytes of ``path``."""

    source_digest: str


def source_digest_of(datamodule: Any) -> str | None:
    """The data module's ``source_digest`` (default ``None``: the bytes of its ``path`` or ``root`` are read)."""
    return str(datamodule.source_digest) if isinstance(datamodule, SourceDigest) else None


def predicts_new_data(datamodule: Any) -> bool:
    """The data module's ``predicts_new_data()`` (default ``False``)."""
    return isinstance(datamodule, PredictsNewData) and bool(datamodule.predicts_new_data())


def new_data_of(datamodule: Any) -> tuple[Dataset, list[Any]] | None:
    """The new data ``predict`` reads (``new_data()``), ``None`` when it predicts a split."""
    return datamodule.new_data() if predicts_new_data(datamodule) else None


def prediction_ids_of(datamodule: Any) -> list[Any]:
    """The data module's ``prediction_ids`` (default: none)."""
    return list((datamodule.prediction_ids if isinstance(datamodule, PredictionIds) else None) or [])


def id_name_of(datamodule: Any) -> str:
    """The data module's ``id_name`` (default ``row``)."""
    return str(datamodule.id_name) if isinstance(datamodule, IdName) else "row"


def raw_examples_of(datamodule: Any) -> Any:
    """A few raw rows of the data module (``raw_examples()``), ``None`` when it has none."""
    return datamodule.raw_examples() if isinstance(datamodule, TableRows) else None


def check_rows_of(datamodule: Any, frame: Any) -> None:
    """The data module's ``check_rows(frame)`` (nothing when it has none)."""
    if isinstance(datamodule, ChecksRows):
        datamodule.check_rows(frame)


def prediction_notes_of(datamodule: Any, frame: Any = None) -> dict[str, list[Any]]:
    """The data module's ``prediction_notes(frame)``, ``{}`` when it has none."""
    return dict(datamodule.prediction_notes(frame)) if isinstance(datamodule, PredictionNotes) else {}


def data_state_of(datamodule: Any) -> dict[str, Any]:
    """The data module's fitted state (``state_dict()``), ``{}`` for one without ``state_dict``."""
    return datamodule.state_dict() if hasattr(datamodule, "state_dict") else {}


def load_data_state(datamodule: Any, state: dict[str, Any]) -> None:
    """Load a checkpoint's data state into the data module (nothing for one without ``load_state_dict``)."""
    if isinstance(datamodule, DataState):
        datamodule.load_state_dict(state)


def loader_settings_of(data_class: Any) -> frozenset[str]:
    """The data class's ``loader_settings`` (default ``LOADER_SETTINGS``)."""
    return frozenset(data_class.loader_settings) if isinstance(data_class, SettingsOutsideSplit) else LOADER_SETTINGS


def new_data_settings_of(data_class: Any) -> tuple[str, ...]:
    """The data class's ``new_data_settings`` (default ``NEW_DATA_SETTINGS``)."""
    return tuple(data_class.new_data_settings) if isinstance(data_class, SettingsOutsideSplit) else NEW_DATA_SETTINGS


def settings_outside_split(data_class: Any) -> frozenset[str]:
    """The settings of the data class the data guard does not compare: its loader and new-data settings."""
    return loader_settings_of(data_class) | frozenset(new_data_settings_of(data_class))


__all__ = [
    "BatchSize", "ChecksRows", "ClassNames", "DATA_SIZES", "DataFile", "DataFolder", "DataState", "IdName",
    "LOADER_SETTINGS", "NEW_DATA_SETTINGS", "PredictionIds", "PredictionNotes", "PredictsNewData",
    "SettingsOutsideSplit", "SplitDatasets", "SplitSizes", "TableRows", "batch_size_of", "check_rows_of",
    "class_names_of", "data_size", "data_state_of", "id_name_of", "load_data_state", "loader_settings_of",
    "new_data_of", "new_data_settings_of", "prediction_ids_of", "prediction_notes_of", "predicts_new_data",
    "raw_examples_of", "settings_outside_split", "source_paths_of", "split_datasets_of", "split_rows_of",
    "split_sizes_of", "SplitRows", "SourceDigest", "source_digest_of",
]
