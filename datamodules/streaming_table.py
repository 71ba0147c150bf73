"""A table larger than memory: Parquet files streamed a row group at a time, encoded as ``TabularDataModule``
encodes a table, shuffled through a bounded window, split by a hash, and resumed exactly mid-epoch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch
from lightning import LightningDataModule
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from datamodules.column_encoding import MISSING_MODES, ColumnEncoder, MissingMode
from datamodules.numeric_scaling import SCALINGS, ScalingKind
from datamodules.parquet_source import ParquetSource
from datamodules.recipe_contract import LOADER_SETTINGS
from datamodules.resumable_loader import ResumableDataLoader
from datamodules.table_rows import EncodedTableRows
from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch
from datamodules.stream_order import (
    DEFAULT_WINDOW,
    SPLIT_CODES,
    Segment,
    TrainPlan,
    already_done,
    evaluation_segments,
    row_hashes,
    split_codes,
    train_windows,
)
from datamodules.tabular import auto_batch_size

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

NAME = "StreamingTableDataModule"
#: Train rows the encoding is fitted on, at most (a seeded sample of whole row groups).
DEFAULT_FIT_ROWS = 100_000


def process_rank() -> tuple[int, int]:
    """This process's rank and the number of processes (``(0, 1)`` outside ``torch.distributed``)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def worker_slot() -> tuple[int, int]:
    """This loader worker's id and the number of workers (``(0, 1)`` in the main process)."""
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


class SplitReader:
    """Reads one split's rows of row groups, encoded: ``(features float32 (N, in_features), targets)``.

    Args:
        source: The Parquet files.
        encoder: The fitted encoding.
        split: "train", "val" or "test".
        key: The column whose hash splits the rows; ``None``: the row numbers.
        seed: The split's seed.
        val_fraction: The share of rows (of keys) in validation.
        test_fraction: The share of rows (of keys) in test.
    """

    def __init__(self, source: ParquetSource, encoder: ColumnEncoder, split: str, key: str | None, seed: int,
                 val_fraction: float, test_fraction: float) -> None:
        self.source, self.encoder, self.code = source, encoder, SPLIT_CODES[split]
        self.key, self.seed = key, seed
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        columns = list(encoder.numeric_columns) + list(encoder.categorical_columns) + [encoder.target]
        self.columns = list(dict.fromkeys(columns + ([key] if key else [])))

    def codes(self, group: int, table: pa.Table | None = None) -> np.ndarray:
        """The split code of each row of row group ``group`` (its key column is read unless ``table`` has it)."""
        if self.key is None:
            keys = self.source.row_numbers(group)
        else:
            table = table if table is not None else self.source.read(group, [self.key])
            keys = table.column(self.key).to_numpy(zero_copy_only=False)
        return split_codes(row_hashes(keys, self.seed), self.val_fraction, self.test_fraction)

    def frame(self, group: int, start: int = 0, stop: int | None = None) -> pd.DataFrame:
        """Rows ``start:stop`` of this split's rows of row group ``group``, as read (a pandas DataFrame)."""
        table = self.source.read(group, self.columns)
        rows = np.flatnonzero(self.codes(group, table) == self.code)[start:stop]
        return table.take(rows).to_pandas()

    def encode(self, pieces: list[Segment]) -> tuple[Tensor, Tensor]:
        """The pieces' rows, encoded, in order: written into one tensor as each row group is encoded (a window's
        memory once, not its pieces and their concatenation)."""
        total = sum(piece.stop - piece.start for piece in pieces)
        features = torch.empty(total, self.encoder.in_features)
        targets = torch.empty(total, dtype=torch.float32 if self.encoder.task == "regression" else torch.long)
        at = 0
        for piece in pieces:
            frame = self.frame(piece.group, piece.start, piece.stop)
            features[at : at + len(frame)] = self.encoder.transform(frame)
            targets[at : at + len(frame)] = self.encoder.targets(frame)
            at += len(frame)
        return features, targets


class StreamingTableDataset(IterableDataset):
    """One split of a streamed table, as batches ``(features, targets)``; see ``datamodules.stream_order`` for the
    order. The train split yields ``TrainPlan.steps`` full batches per process and epoch, shuffled; the others every
    row once, in file order.

    ``start_pass(epoch, batches)`` (called by ``ResumableDataLoader`` before its workers start) chooses the epoch of
    the next pass and where in it to start; without it a pass follows ``epoch``.

    Args:
        reader: Reads the split's rows.
        counts: The split's rows in each row group.
        batch_size: Rows per batch.
        seed: The shuffling seed.
        window: Rows a process holds for shuffling (split among its loader workers).
        shuffle: Shuffle and cut whole batches (the train split) or read in order.
    """

    def __init__(self, reader: SplitReader, counts: np.ndarray, batch_size: int, seed: int, window: int,
                 shuffle: bool) -> None:
        self.reader, self.counts = reader, counts
        self.batch_size, self.seed, self.window, self.shuffle = batch_size, seed, window, shuffle
        self.epoch = 0  # the epoch of the next pass
        self.pass_epoch: int | None = None
        self.skip = 0

    def start_pass(self, epoch: int, batches: int) -> None:
        """The next pass is of ``epoch`` and starts after its first ``batches`` batches."""
        self.pass_epoch, self.skip, self.epoch = epoch, batches, epoch + 1

    def plan(self) -> TrainPlan:
        """How this epoch's train rows are shared among the processes."""
        return TrainPlan(int(self.counts.sum()), self.batch_size, process_rank()[1])

    def __len__(self) -> int:
        """Batches this process reads in a pass (all of its loader workers together)."""
        if self.shuffle:
            return self.plan().steps
        rank, world = process_rank()
        return sum(-(-rows // self.batch_size) for rows in self.evaluation_rows(rank, world))

    def evaluation_rows(self, rank: int, world: int) -> list[int]:
        """Rows each of this process's loader workers reads in order (the split unshuffled)."""
        workers = worker_slot()[1] if get_worker_info() is not None else self.loader_workers
        return [sum(p.stop - p.start for p in evaluation_segments(self.counts, rank, world, w, workers))
                for w in range(workers)]

    loader_workers = 1  # set by the data module: the workers its loaders start

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        rank, world = process_rank()
        worker, workers = worker_slot()
        if not self.shuffle:
            yield from self._in_order(evaluation_segments(self.counts, rank, world, worker, workers))
            return
        epoch = self.pass_epoch if self.pass_epoch is not None else self.epoch
        part = (worker + self.skip) % workers  # the pass starts at batch `skip`: worker 0 reads that batch's part
        windows = train_windows(
            self.plan(), self.counts, seed=self.seed, epoch=epoch, rank=rank, part=part, workers=workers,
            window=self.window, skip_batches=already_done(self.skip, part, workers),
        )
        for pieces, permutation, drop in windows:
            features, targets = self.reader.encode(pieces)
            order = torch.from_numpy(permutation)
            for start in range(drop, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                yield features[rows], targets[rows]
            del features, targets, order, permutation  # one window in memory at a time, not two while the next fills

    def _in_order(self, pieces: list[Segment]) -> Iterator[tuple[Tensor, Tensor]]:
        """The pieces' rows in batches (the last one of the worker may be short)."""
        held: list[tuple[Tensor, Tensor]] = []
        size = 0
        for piece in pieces:
            features, targets = self.reader.encode([piece])
            held.append((features, targets))
            size += len(targets)
            while size >= self.batch_size:
                x, y = torch.cat([h[0] for h in held]), torch.cat([h[1] for h in held])
                yield x[: self.batch_size], y[: self.batch_size]
                held, size = [(x[self.batch_size :], y[self.batch_size :])], size - self.batch_size
        if size:
            yield torch.cat([h[0] for h in held]), torch.cat([h[1] for h in held])


class StreamingTableDataModule(EncodedTableRows, LightningDataModule):
    """A table of Parquet files larger than memory, streamed a row group at a time, for classification or regression.

    Columns are encoded as ``TabularDataModule`` encodes them (numeric columns scaled, missing values imputed with
    indicators, categorical columns one-hot with ``<unknown>`` and ``<missing>`` slots, integer columns numeric);
    which columns are categorical comes from the files' types (strings, booleans and dictionaries are categorical).

    What is read when:

    * ``setup``: the files' metadata (row groups and row counts); one pass over the ``key`` column (when set) and,
      for classification, the target column, a row group at a time: each split's rows per row group and the class
      names (every label of the table); then the encoding (scaling statistics, medians, vocabularies) is fitted on a
      seeded sample of at most ``fit_rows`` train rows from whole row groups, so a category that is rare and absent
      from the sample takes the ``<unknown>`` slot. The train split's size is known here: the schedules get their
      total steps.
    * Each epoch: the row groups, once each (the train split in a seeded order), holding ``window`` encoded rows
      per process for shuffling: about ``window * in_features * 4`` bytes (the default 1,048,576 rows of 30
      features: 126 MB), plus the row group being read.

    Splits: a row's split is a stable hash of its ``key`` (or of its row number), so no split needs the whole
    table, every row of one key is in one split, and ``val_fraction``/``test_fraction`` are shares of keys.

    Each train row is read once per epoch over all processes and loader workers, except a remainder drawn anew each
    epoch (fewer than ``world_size`` rows plus fewer than ``batch_size`` rows per process) that keeps every
    process's number of steps equal. The train loader's position is part of every checkpoint (a
    ``ResumableDataLoader``): a run resumed mid-epoch, by ``recipes`` or a plain ``lightning.Trainer``, sees the
    batches an uninterrupted run sees, with the same number of loader workers and processes.

    Args:
        path: A ``.parquet``/``.pq`` file, a folder of them or a glob, local or a URI (``s3://``, ``gs://``,
            ``hf://``, any scheme pyarrow or fsspec opens; credentials from the usual environment).
        target: The column to predict.
        features: The columns to use as inputs, in this order; default: every column except the target and key.
        categorical: The feature columns to one-hot encode; default: the string, boolean and dictionary columns.
        task: "classification" or "regression".
        key: The column whose hash decides each row's split (e.g. a user id); default: the row's number in the
            files (a row keeps its split while rows are appended in new files).
        val_fraction: The share of rows (of keys) in validation.
        test_fraction: The share of rows (of keys) in test.
        seed: The seed of the split, the fitting sample and the shuffling.
        batch_size: Rows per batch, or "auto" (``TabularDataModule``'s rule on the train rows).
        window: Rows a process holds for shuffling the train split (split among its loader workers); larger mixes
            more row groups at once and takes more memory.
        fit_rows: Train rows the encoding is fitted on, at most.
        missing: "impute" or "error", as ``TabularDataModule``.
        scaling: "standard", "quantile" or "robust", as ``TabularDataModule``.
        num_workers: Loader worker processes per loader (each reads its own row groups).
        pin_memory: Pin batches for a faster copy to the GPU; default: when training on CUDA.
    """

    #: Settings that never choose which rows a split holds (the data guard does not compare them): the loaders' and
    #: the shuffle window's.
    loader_settings: ClassVar[frozenset[str]] = LOADER_SETTINGS | {"window"}
    #: It predicts its test split (no new-data setting).
    new_data_settings: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        path: str,
        target: str,
        features: list[str] | None = None,
        categorical: list[str] | None = None,
        task: Literal["classification", "regression"] = "classification",
        key: str | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        batch_size: int | Literal["auto"] = 512,
        window: int = DEFAULT_WINDOW,
        fit_rows: int = DEFAULT_FIT_ROWS,
        missing: MissingMode = "impute",
        scaling: ScalingKind = "standard",
        num_workers: int = 0,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__()
        if task not in ("classification", "regression"):
            raise ValueError(f"{NAME}: task must be 'classification' or 'regression', got {task!r}")
        if missing not in MISSING_MODES:
            raise ValueError(f"{NAME}: missing must be one of {list(MISSING_MODES)}, got {missing!r}")
        if scaling not in SCALINGS:
            raise ValueError(f"{NAME}: scaling must be one of {list(SCALINGS)}, got {scaling!r}")
        if not 0.0 <= val_fraction < 1.0 or not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
            raise ValueError(f"{NAME}: val_fraction and test_fraction must be in [0, 1) and leave rows for training")
        if batch_size != "auto" and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"{NAME}: batch_size must be a whole number >= 1 or 'auto', got {batch_size!r}")
        for name, value in (("window", window), ("fit_rows", fit_rows)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{NAME}: {name} must be a whole number >= 1, got {value!r}")
        if num_workers < 0:
            raise ValueError(f"{NAME}: num_workers must be >= 0, got {num_workers}")
        self.save_hyperparameters(logger=False)
        self.path, self.target, self.features, self.categorical = path, target, features, categorical
        self.task, self.key, self.seed = task, key, seed
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.auto_batch_size = batch_size == "auto"
        self.batch_size = 512 if batch_size == "auto" else batch_size
        self.window, self.fit_rows, self.missing, self.scaling = window, fit_rows, missing, scaling
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.source: ParquetSource | None = None
        self.encoder: ColumnEncoder | None = None
        self.split_counts: dict[str, np.ndarray] = {}
        self._restored: dict[str, Any] | None = None
        self.prediction_ids: list[Any] = []  # one id per row of the last predict_dataloader

    #: A prediction's id: the row's number in the files (counted from 0 over the files in order).
    id_name: ClassVar[str] = "row"

    # --- sizes ---------------------------------------------------------------------------------------------------
    def fitted_encoder(self) -> ColumnEncoder:
        """The encoding: the checkpoint's, or the one ``setup`` fits."""
        return self._fitted()

    def _fitted(self) -> ColumnEncoder:
        """The encoding, fitted or restored from a checkpoint (``setup`` runs when there is neither: a restored
        encoding needs no file, as in a served model)."""
        if self.encoder is None or not self.encoder.fitted:
            self.setup()
        assert self.encoder is not None
        return self.encoder

    @property
    def class_names(self) -> list[str] | None:
        """Name of each class id (every label of the table, sorted); ``None`` for regression."""
        return None if self.task == "regression" else self._fitted().class_names

    @property
    def source_digest(self) -> str:
        """The files' identity from their Parquet metadata (names, row groups, sizes, column statistics): the run's
        dataset input and the data guard's digest, without reading the rows."""
        if self.source is None:
            self.source = ParquetSource(self.path, owner=NAME)
        return self.source.fingerprint

    @property
    def split_sizes(self) -> dict[str, int]:
        """Rows per split (after ``setup``)."""
        return {name: int(counts.sum()) for name, counts in self.split_counts.items()}

    # --- setup ---------------------------------------------------------------------------------------------------
    def _new_encoder(self, numeric: list[str], categorical: list[str]) -> ColumnEncoder:
        return ColumnEncoder(self.target, self.task, numeric, categorical, owner=NAME, source=repr(self.path),
                             warn=rank_zero_warn, missing=self.missing, scaling=self.scaling)  # type: ignore[arg-type]

    def _columns(self, source: ParquetSource) -> tuple[list[str], list[str]]:
        """The numeric and categorical feature columns, from the files' types."""
        import pyarrow as pa

        available = source.columns
        for role, name in (("target", self.target), ("key", self.key)):
            if name is not None and name not in available:
                raise ValueError(f"{NAME}: the {role} column {name!r} is not in {self.path!r}; columns: {available}")
        features = self.features or [c for c in available if c not in (self.target, self.key)]
        missing = [c for c in features if c not in available]
        if missing:
            raise ValueError(f"{NAME}: feature column(s) {missing} are not in {self.path!r}; columns: {available}")
        if self.categorical is not None:
            stray = [c for c in self.categorical if c not in features]
            if stray:
                raise ValueError(f"{NAME}: categorical lists {stray}, which are not feature columns {features}")
            chosen = set(self.categorical)
        else:
            types = {f.name: f.type for f in source.schema}
            chosen = {c for c in features if not (pa.types.is_integer(types[c]) or pa.types.is_floating(types[c])
                                                  or pa.types.is_decimal(types[c]))}
        return [c for c in features if c not in chosen], [c for c in features if c in chosen]

    def setup(self, stage: str | None = None) -> None:
        """Read the metadata, count each split's rows per row group (and the labels), fit the encoding on a sample."""
        if self.source is not None and self.split_counts and self.encoder is not None and self.encoder.fitted:
            return
        # the metadata read once: source_digest (the data guard, before setup) may have opened the files already
        source = self.source if self.source is not None else ParquetSource(self.path, owner=NAME)
        if self._restored is not None:
            assert self.encoder is not None
            encoder = self.encoder
            missing = [c for c in encoder.numeric_columns + encoder.categorical_columns if c not in source.columns]
            if missing:
                raise ValueError(f"{NAME}: the checkpoint's model was trained on columns {missing}, not in {self.path!r}")
        else:
            encoder = self._new_encoder(*self._columns(source))
        counts, labels = self._count(source, encoder)
        if encoder.class_names is None and self.task == "classification":
            import pandas as pd

            encoder.targets(pd.DataFrame({self.target: pd.Series(sorted(labels, key=repr))}))  # sets class_names
        self.source, self.encoder, self.split_counts = source, encoder, counts
        if not encoder.fitted:
            encoder.fit(self._fit_sample(source, encoder))
        if self.auto_batch_size:
            self.batch_size = auto_batch_size(self.split_sizes["train"])
        for split, rows in self.split_sizes.items():
            if split == "train" and TrainPlan(rows, self.batch_size).steps == 0:
                raise ValueError(f"{NAME}: the train split has {rows} rows, fewer than one batch of {self.batch_size}")

    def _reader(self, split: str, source: ParquetSource | None = None, encoder: ColumnEncoder | None = None) -> SplitReader:
        return SplitReader(source or self.source, encoder or self.encoder, split, self.key, self.seed,  # type: ignore[arg-type]
                           self.val_fraction, self.test_fraction)

    def _count(self, source: ParquetSource, encoder: ColumnEncoder) -> tuple[dict[str, np.ndarray], set[Any]]:
        """Each split's rows per row group, and the distinct labels (classification): one pass over the key and
        target columns."""
        reader = self._reader("train", source, encoder)
        columns = ([self.key] if self.key else []) + ([self.target] if self.task == "classification" else [])
        counts = np.zeros((3, source.groups), dtype=np.int64)
        labels: set[Any] = set()
        for group in range(source.groups):
            table = source.read(group, columns) if columns else None
            codes = reader.codes(group, table)
            counts[:, group] = np.bincount(codes, minlength=3)
            if self.task == "classification" and table is not None:
                labels.update(v for v in table.column(self.target).unique().to_pylist() if v is not None)
        return {split: counts[code] for split, code in SPLIT_CODES.items()}, labels

    def _fit_sample(self, source: ParquetSource, encoder: ColumnEncoder) -> pd.DataFrame:
        """At most ``fit_rows`` train rows: whole row groups' train rows in a seeded order."""
        import pandas as pd

        reader, frames, rows = self._reader("train", source, encoder), [], 0
        for group in np.random.default_rng([self.seed, 0xF17]).permutation(source.groups):
            if rows >= self.fit_rows:
                break
            frame = reader.frame(int(group))
            frames.append(frame)
            rows += len(frame)
        return pd.concat(frames, ignore_index=True).head(self.fit_rows)

    # --- loaders -------------------------------------------------------------------------------------------------
    def dataset(self, split: str, workers: int | None = None) -> StreamingTableDataset:
        """The split's streaming dataset (read by ``workers`` loader workers; default ``num_workers``)."""
        if not self.split_counts:
            self.setup()
        dataset = StreamingTableDataset(self._reader(split), self.split_counts[split], self.batch_size, self.seed,
                                        self.window, shuffle=split == "train")
        dataset.loader_workers = max(self.num_workers if workers is None else workers, 1)
        return dataset

    def _loader(self, split: str) -> DataLoader:
        dataset = self.dataset(split)
        pin = self.pin_memory if self.pin_memory is not None else bool(
            self.trainer is not None and self.trainer.strategy.root_device.type == "cuda"
        )
        kwargs: dict[str, Any] = {"batch_size": None, "num_workers": self.num_workers, "pin_memory": pin}
        if split != "train":
            return DataLoader(dataset, **kwargs)
        dataset.epoch = self.trainer.current_epoch if self.trainer is not None else 0
        return ResumableDataLoader(dataset, **kwargs)

    def split_row_numbers(self, split: str) -> np.ndarray:
        """The row numbers (over the files, from 0) of a split's rows, in file order: one pass over the key column
        (or none, splitting by row number)."""
        reader = self._reader(split)
        numbers = [self.source.row_numbers(g)[reader.codes(g) == reader.code] for g in range(self.source.groups)]  # type: ignore[union-attr]
        return np.concatenate(numbers) if numbers else np.zeros(0, dtype=np.int64)

    def predict_dataloader(self) -> DataLoader:
        """The test split (the val split without one), in file order, in one process without loader workers;
        ``prediction_ids`` are the rows' numbers in the files."""
        if not self.split_counts:
            self.setup()
        split = "test" if self.split_sizes.get("test") else "val"
        self.prediction_ids = self.split_row_numbers(split).tolist()
        return DataLoader(self.dataset(split, workers=1), batch_size=None, num_workers=0)

    def inference_loader(self, dataset: BatchedTensorDataset) -> DataLoader:  # type: ignore[override]
        """A loader over ``frame_data``'s rows that keeps their order."""
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False, collate_fn=keep_batch)

    def raw_examples(self, count: int = 5) -> pd.DataFrame:
        """The first ``count`` rows of the first row group's feature columns, as read (the MLflow model's input
        example)."""
        encoder = self._fitted()
        columns = list(encoder.numeric_columns) + list(encoder.categorical_columns)
        if self.source is None:
            self.source = ParquetSource(self.path, owner=NAME)
        return self.source.read(0, columns).slice(0, count).to_pandas()

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    # --- checkpoints ---------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The encoding (class names, columns, vocabularies, numeric statistics); empty before ``setup``."""
        return self.encoder.state_dict() if self.encoder is not None and self.encoder.fitted else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Use a checkpoint's encoding from now on.

        Args:
            state_dict: What ``state_dict`` returned when the checkpoint was saved.
        """
        if not state_dict or (self.encoder is not None and self.encoder.fitted and self.state_dict() == state_dict):
            return
        encoder = self._new_encoder([], [])
        encoder.load_state_dict(state_dict)
        self.encoder, self._restored = encoder, dict(state_dict)
        self.split_counts = {}
