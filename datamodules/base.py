"""The base data module: seeded split before preprocessing, train-only statistics, one loader factory."""

from __future__ import annotations

import random
from typing import Any, Callable, ClassVar

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, Dataset, Sampler

from datamodules.evaluation_sampling import evaluation_shard
from datamodules.resumable_loader import ResumableDataLoader
from datamodules.samplers import EpochRandomSampler
from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch

SPLITS = ("train", "val", "test")
WORKER_SEED_OFFSET = 1_000_003


def select(inputs: Any, indices: Tensor) -> Any:
    """The rows ``indices`` of a tensor, or the items of any other sequence, in that order."""
    if isinstance(inputs, Tensor):
        return inputs[indices]
    return [inputs[i] for i in indices.tolist()]


def seed_worker(worker_id: int) -> None:
    """Seed NumPy and ``random`` in a DataLoader worker from the seed torch gave that worker.

    torch seeds each worker from the loader's generator, so worker randomness follows the data module's seed.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def split_indices(
    n: int, val_fraction: float, test_fraction: float, seed: int, labels: Tensor | None = None
) -> dict[str, Tensor]:
    """Disjoint, complete, seeded train/val/test index sets over ``range(n)``.

    With ``labels`` the split is stratified: each class is split on its own, so class ratios in every split stay
    within one sample of the whole.
    """
    generator = torch.Generator().manual_seed(seed)
    if labels is None:
        groups = [torch.randperm(n, generator=generator)]
    else:
        groups = []
        for cls in torch.unique(labels, sorted=True):
            members = torch.nonzero(labels == cls, as_tuple=True)[0]
            groups.append(members[torch.randperm(len(members), generator=generator)])
    parts: dict[str, list[Tensor]] = {s: [] for s in SPLITS}
    for group in groups:
        n_val = int(round(len(group) * val_fraction))
        n_test = int(round(len(group) * test_fraction))
        parts["val"].append(group[:n_val])
        parts["test"].append(group[n_val : n_val + n_test])
        parts["train"].append(group[n_val + n_test :])
    out = {}
    for split, pieces in parts.items():
        joined = torch.cat(pieces) if pieces else torch.empty(0, dtype=torch.long)
        # shuffle across classes so the split is not ordered by class
        out[split] = joined[torch.randperm(len(joined), generator=generator)]
    return out


class BaseDataModule(LightningDataModule):
    """Base of the loopwise data modules.

    Owns the seeded train/val/test split (done before any preprocessing), preprocessing statistics fitted on the
    train split only, and one loader factory: ``pin_memory`` when training on CUDA, ``persistent_workers`` when
    ``num_workers > 0``, ``drop_last`` for the train loader only, a seeded generator and seeded workers.
    In-memory subclasses implement ``load`` and get whole-batch tensor indexing.

    Args:
        batch_size: Samples per batch (train, val, test and predict).
        val_fraction: Fraction of the samples held out for validation.
        test_fraction: Fraction of the samples held out for testing.
        seed: Seed of the split and of the train shuffling.
        num_workers: DataLoader worker processes (0 loads in the main process; best for in-memory data).
        drop_last: Drop the last incomplete train batch (never applied to val/test).
        pin_memory: Pin host memory for faster host-to-GPU copies; default: on when training on CUDA.
        stratify: Split each class on its own so every split keeps the class ratios (classification data).
        device_resident: For small in-memory data on a GPU: copy each split's tensors to the training device once
            and index every batch there (no per-batch host-to-device copy; Lightning's batch transfer becomes a
            no-op). The loader then runs in the main process without pinning (``num_workers`` and ``pin_memory``
            are ignored). The batches are the same as without it; on CPU it changes nothing.

    A subclass takes these arguments as ``**kwargs`` and passes them on to ``BaseDataModule.__init__`` (LightningCLI
    and ``--data.help`` still list them, with the documentation above); it names only those whose default it changes
    and those it sets itself (``fixed_arguments``).

    What the ``recipes`` command asks of a data module (this one or your own): ``datamodules.recipe_contract``.
    """

    #: The loopwise data modules set it: ``__init__`` then saves the constructor arguments as the hyperparameters
    #: (the subclass's own and the base arguments it passes on through ``**kwargs``, defaults included), which
    #: ``load_from_checkpoint`` rebuilds the module from. A data module written elsewhere saves what it wants itself.
    save_init_arguments: ClassVar[bool] = False
    #: Base arguments a subclass sets itself in its ``super().__init__()`` call (not options of its own, so
    #: LightningCLI does not list them): left out of the saved hyperparameters.
    fixed_arguments: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        batch_size: int = 64,
        val_fraction: float = 0.2,
        test_fraction: float = 0.0,
        seed: int = 0,
        num_workers: int = 0,
        drop_last: bool = False,
        pin_memory: bool | None = None,
        stratify: bool = True,
        device_resident: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if batch_size < 1:
            raise ValueError(f"{name}: batch_size must be >= 1, got {batch_size}")
        if not 0.0 <= val_fraction < 1.0 or not 0.0 <= test_fraction < 1.0 or val_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"{name}: val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be in [0, 1) and "
                "leave samples for training"
            )
        if num_workers < 0:
            raise ValueError(f"{name}: num_workers must be >= 0, got {num_workers}")
        self.batch_size = batch_size
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.seed = seed
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.pin_memory = pin_memory
        self.stratify = stratify
        self.device_resident = device_resident
        self.datasets: dict[str, Dataset] = {}
        self._resident: dict[tuple[int, str], BatchedTensorDataset] = {}
        self.class_counts: list[int] | None = None
        self.split_rows: dict[str, Tensor] = {}  # the source's sample numbers in each split
        self.prediction_ids: list[Any] = []  # one id per sample of the last predict_dataloader, in order
        self._checked_new_data: tuple[Dataset, list[Any]] | None = None
        if self.save_init_arguments:
            # collected from this frame and the subclasses' __init__ frames above it (Lightning merges **kwargs), or
            # the parsed config when LightningCLI builds the module
            self.save_hyperparameters(ignore=list(self.fixed_arguments), logger=False)

    # --- what subclasses provide ----------------------------------------------------------------------------
    def load(self) -> tuple[Any, Tensor]:
        """All samples as (inputs, targets) before any split or preprocessing.

        ``inputs`` is a tensor for in-memory data (features, images) or any sequence for file-backed data (file
        paths, texts); ``targets`` is a tensor (class ids for classification).
        """
        raise NotImplementedError

    def fit_preprocessing(self, train_inputs: Any) -> None:
        """Learn preprocessing statistics or vocabularies from the train split only (default: none)."""

    def preprocess(self, inputs: Any) -> Any:
        """Apply the fitted preprocessing to the inputs of any split (default: identity)."""
        return inputs

    def make_dataset(self, split: str, inputs: Any, targets: Tensor) -> Dataset:
        """The dataset of one split (default: preprocessed tensors fetched a whole batch at a time)."""
        return BatchedTensorDataset(self.preprocess(inputs), targets)

    def train_sampler(self, dataset: Dataset) -> Sampler | None:
        """A sampler for the train split instead of seeded shuffling (default: none)."""
        return None

    def batch_sampler(self, dataset: Dataset, train: bool) -> Sampler | None:
        """A batch sampler (e.g. length buckets) that replaces batch_size/shuffle/drop_last (default: none)."""
        return None

    def collate_fn(self, dataset: Dataset) -> Callable[[Any], Any] | None:
        """How samples become a batch (default: already batched for tensors, torch's default otherwise)."""
        return keep_batch if isinstance(dataset, BatchedTensorDataset) else None

    def new_data(self) -> tuple[Dataset, list[Any]] | None:
        """The new data to predict (a module's ``predict_path``), preprocessed as at training time, with one id per
        sample; ``None`` (the default) predicts a split of the training data instead."""
        return None

    def frame_data(self, frame: Any) -> tuple[Dataset, list[Any]]:
        """The rows of an in-memory table (a pandas DataFrame of raw inputs, as the module reads them from its
        files), preprocessed as at training time, with one id per row. The MLflow model of a run predicts with it.
        Modules that read files implement it; the default says so."""
        raise NotImplementedError(f"{type(self).__name__} does not predict raw rows of a table (frame_data)")

    def inference_loader(self, dataset: Dataset) -> DataLoader:
        """A loader over ``dataset`` that keeps its order (for predictions of ``frame_data``'s rows)."""
        return self.make_loader(dataset, train=False)

    def raw_examples(self, count: int = 5) -> Any:
        """A few raw inputs as ``frame_data`` takes them (a pandas DataFrame), for an MLflow model's input example
        and signature; ``None`` when the module has no such form (the default)."""
        return None

    def check_new_data(self) -> None:
        """Read and preprocess the new data now, so that a bad file is an error before anything runs;
        ``predict_dataloader`` then uses what was read."""
        self._checked_new_data = self.new_data()

    def predicts_new_data(self) -> bool:
        """Whether ``predict_dataloader`` reads new data (``predict_path``) rather than a split (default: no)."""
        return False

    #: What a prediction's id is: the sample's number in the source ("row") or, for files, its "path".
    id_name: ClassVar[str] = "row"

    def sample_id(self, number: int) -> Any:
        """The id of the source's sample ``number`` in prediction outputs (default: the number itself)."""
        return number

    # --- description ----------------------------------------------------------------------------------------
    @property
    def num_classes(self) -> int | None:
        """Number of classes, for classification data; ``None`` otherwise."""
        return None

    @property
    def split_sizes(self) -> dict[str, int]:
        """Samples per split (after ``setup``)."""
        return {split: len(ds) for split, ds in self.datasets.items()}  # type: ignore[arg-type]

    # --- Lightning hooks -------------------------------------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        if self.datasets or (stage == "predict" and self.predicts_new_data()):
            return  # new data is read by predict_dataloader, with the preprocessing of the checkpoint
        inputs, targets = self.load()
        self.validate_samples(inputs, targets)
        is_class_data = self.num_classes is not None
        labels = targets if (self.stratify and is_class_data) else None
        indices = split_indices(len(inputs), self.val_fraction, self.test_fraction, self.seed, labels)
        self.check_split_sizes(indices)
        self.fit_preprocessing(select(inputs, indices["train"]))
        for split, idx in indices.items():
            self.datasets[split] = self.make_dataset(split, select(inputs, idx), targets[idx])
            self.split_rows[split] = idx
        if is_class_data:
            counts = torch.bincount(targets[indices["train"]], minlength=self.num_classes)
            self.class_counts = counts.tolist()

    def validate_samples(self, features: Any, targets: Tensor) -> None:
        """Reject non-finite features and out-of-range labels with a message naming the first bad row."""
        name = type(self).__name__
        if len(features) == 0:
            raise ValueError(f"{name}: the data set is empty")
        if isinstance(features, Tensor) and features.is_floating_point():
            bad = ~torch.isfinite(features.reshape(len(features), -1)).all(dim=1)
            if bad.any():
                row = int(torch.nonzero(bad)[0])
                raise ValueError(f"{name}: {int(bad.sum())} sample(s) have NaN or inf features; first at row {row}")
        if self.num_classes is not None:
            out = (targets < 0) | (targets >= self.num_classes)
            if out.any():
                row = int(torch.nonzero(out)[0])
                raise ValueError(
                    f"{name}: label {int(targets[row])} at row {row} is outside [0, {self.num_classes - 1}]"
                )

    def check_split_sizes(self, indices: dict[str, Tensor]) -> None:
        """Fail before training on an empty split or a train split that drop_last would empty."""
        name = type(self).__name__
        sizes = {split: len(idx) for split, idx in indices.items()}
        if sizes["train"] == 0:
            raise ValueError(f"{name}: the train split is empty (sizes {sizes})")
        for split, fraction in (("val", self.val_fraction), ("test", self.test_fraction)):
            if fraction > 0 and sizes[split] == 0:
                raise ValueError(f"{name}: {split}_fraction={fraction} leaves the {split} split empty (sizes {sizes})")
        if self.drop_last and sizes["train"] < self.batch_size:
            raise ValueError(
                f"{name}: the train split has {sizes['train']} samples, fewer than batch_size={self.batch_size} "
                "with drop_last=True, so every batch would be dropped"
            )

    # --- the loader factory ---------------------------------------------------------------------------------
    def uses_cuda(self) -> bool:
        """Whether the attached trainer runs on a CUDA device."""
        trainer = self.trainer
        return trainer is not None and trainer.strategy.root_device.type == "cuda"

    def training_device(self) -> torch.device:
        """The device the attached trainer trains on (CPU without a trainer)."""
        trainer = self.trainer
        return trainer.strategy.root_device if trainer is not None else torch.device("cpu")

    def on_device(self, dataset: Dataset) -> Dataset:
        """``dataset`` with its tensors on the training device (copied once per split and device), for
        ``device_resident``; any other dataset is returned as it is."""
        if not isinstance(dataset, BatchedTensorDataset):
            return dataset
        device = self.training_device()
        if all(t.device == device for t in dataset.tensors):
            return dataset
        key = (id(dataset), str(device))
        if key not in self._resident:
            self._resident[key] = BatchedTensorDataset(*(t.to(device) for t in dataset.tensors))
        return self._resident[key]

    def make_loader(self, dataset: Dataset, train: bool) -> DataLoader:
        """The one place loaders are built: seeded shuffling for train, batch fetching, pinning, workers."""
        epoch = self.trainer.current_epoch if self.trainer is not None else 0
        resident = self.device_resident and isinstance(dataset, BatchedTensorDataset)
        if resident:
            dataset = self.on_device(dataset)
        num_workers = 0 if resident else self.num_workers
        kwargs: dict[str, Any] = {
            "num_workers": num_workers,
            "pin_memory": False if resident else self.uses_cuda() if self.pin_memory is None else self.pin_memory,
            "collate_fn": self.collate_fn(dataset),
            # seeds the workers only; shuffling has its own generator below, so the order of every epoch is the
            # same with 0 or N (persistent) workers
            "generator": torch.Generator().manual_seed(self.seed + epoch + WORKER_SEED_OFFSET),
        }
        if num_workers > 0:
            kwargs.update(persistent_workers=True, worker_init_fn=seed_worker)
        # a train loader's position in the epoch is part of a checkpoint: a mid-epoch resume goes on from there
        loader_class = ResumableDataLoader if train else DataLoader
        batch_sampler = self.batch_sampler(dataset, train)
        if batch_sampler is not None:
            return loader_class(dataset, batch_sampler=batch_sampler, **kwargs)
        sampler = self.train_sampler(dataset) if train else None
        if train and sampler is None:
            # the permutation of epoch e comes from seed + e (Lightning calls set_epoch), not from a generator's
            # stream: a run resumed from a checkpoint sees the same shuffles as an uninterrupted one
            sampler = EpochRandomSampler(dataset, seed=self.seed)
            sampler.set_epoch(epoch)
        return loader_class(
            dataset,
            batch_size=self.batch_size,
            sampler=sampler,
            drop_last=self.drop_last and train,
            **kwargs,
        )

    def split(self, name: str) -> Dataset:
        """The dataset of one split, with a clear error when it does not exist."""
        if not self.datasets:
            self.setup()
        dataset = self.datasets.get(name)
        if dataset is None or len(dataset) == 0:  # type: ignore[arg-type]
            raise ValueError(f"{type(self).__name__}: there is no {name} split; set {name}_fraction > 0")
        return dataset

    def train_dataloader(self) -> DataLoader:
        return self.make_loader(self.split("train"), train=True)

    def val_dataloader(self) -> DataLoader:
        return self.evaluation_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.evaluation_loader("test")

    def evaluation_loader(self, split: str) -> DataLoader:
        """The loader of the val or test split. Under DDP each process evaluates its own shard, every sample once
        (``EvaluationShardSampler``, which Lightning leaves in place; its ``DistributedSampler`` would repeat samples
        to pad the split), so synced metrics are those of one process; length buckets become the shard sorted by
        length. A batch sampler of a subclass's own (no ``lengths``) is left to Lightning."""
        loader = self.make_loader(self.split(split), train=False)
        batches, lengths = loader.batch_sampler, getattr(loader.batch_sampler, "lengths", None)
        if type(batches) is not BatchSampler and lengths is None:
            return loader
        shard = evaluation_shard(loader.dataset, self.trainer, lengths, f"{type(self).__name__}'s {split} split")
        if shard is None:
            return loader
        return DataLoader(
            loader.dataset, batch_size=getattr(batches, "batch_size", None) or self.batch_size, sampler=shard,
            num_workers=loader.num_workers, pin_memory=loader.pin_memory, collate_fn=loader.collate_fn,
            generator=loader.generator, persistent_workers=loader.persistent_workers,
            worker_init_fn=loader.worker_init_fn,
        )

    def predict_dataloader(self) -> DataLoader:
        """Predict the new data of ``predict_path`` (modules that read files), in input order; without it the test
        split, or the val split when there is no test split. ``prediction_ids`` names each sample (its row number
        in the file, or its path)."""
        new, self._checked_new_data = self._checked_new_data or self.new_data(), None
        if new is not None:
            dataset, self.prediction_ids = new
            return self.make_loader(dataset, train=False)
        if not self.datasets:
            self.setup()
        name = "test" if len(self.datasets["test"]) else "val"  # type: ignore[arg-type]
        loader = self.make_loader(self.split(name), train=False)
        rows = self.split_rows.get(name)
        self.prediction_ids = [self.sample_id(int(i)) for i in rows] if rows is not None else []
        return loader
