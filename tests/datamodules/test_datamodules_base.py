"""The base data module: split, train-only statistics, the loader factory and bad-input errors."""

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from datamodules.base import BaseDataModule, split_indices
from datamodules.preprocessing import Standardizer
from datamodules.tensor_dataset import BatchedTensorDataset, keep_batch


class ArrayDataModule(BaseDataModule):
    """A data module over given tensors, with train-fitted standardization."""

    def __init__(self, x, y, classes=None, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.classes = x, y, classes
        self.standardizer = Standardizer()

    @property
    def num_classes(self):
        return self.classes

    def load(self):
        return self.x, self.y

    def fit_preprocessing(self, train_features):
        self.standardizer.fit(train_features)

    def preprocess(self, features):
        return self.standardizer.transform(features)


def test_split_is_seeded_disjoint_and_complete():
    a = split_indices(1000, 0.2, 0.1, seed=7)
    b = split_indices(1000, 0.2, 0.1, seed=7)
    c = split_indices(1000, 0.2, 0.1, seed=8)
    assert all(torch.equal(a[s], b[s]) for s in a)
    assert not torch.equal(a["train"], c["train"])
    joined = torch.cat([a["train"], a["val"], a["test"]])
    assert sorted(joined.tolist()) == list(range(1000))
    assert (len(a["train"]), len(a["val"]), len(a["test"])) == (700, 200, 100)


def test_stratified_split_keeps_class_ratios_within_one_sample():
    labels = torch.tensor([0] * 900 + [1] * 100)
    parts = split_indices(1000, 0.2, 0.1, seed=0, labels=labels)
    for split, expected_minority in (("train", 70), ("val", 20), ("test", 10)):
        minority = int((labels[parts[split]] == 1).sum())
        assert abs(minority - expected_minority) <= 1, split


def test_statistics_come_from_the_train_split_only():
    # rows 0..799 ~ N(0, 1); rows 800..999 shifted by +100. With a stratified split on a label that marks the
    # shifted rows, each split gets a share of them; the train statistics must equal those of the train rows.
    torch.manual_seed(0)
    x = torch.randn(1000, 3)
    x[800:] += 100.0
    y = (torch.arange(1000) >= 800).long()
    dm = ArrayDataModule(x, y, classes=2, val_fraction=0.25, test_fraction=0.0, seed=1)
    dm.setup("fit")
    idx = split_indices(1000, 0.25, 0.0, seed=1, labels=y)
    train_raw = x[idx["train"]]
    assert torch.allclose(dm.standardizer.mean, train_raw.mean(0), atol=1e-4)
    assert not torch.allclose(dm.standardizer.mean, x.mean(0), atol=1e-3)
    # the val split is transformed with the train statistics, not its own
    val = dm.datasets["val"].tensors[0]
    assert torch.allclose(val, (x[idx["val"]] - train_raw.mean(0)) / train_raw.std(0, unbiased=False), atol=1e-4)


def test_batched_dataset_matches_per_sample_loading():
    x = torch.randn(103, 4)
    y = torch.randint(0, 3, (103,))
    fast = DataLoader(BatchedTensorDataset(x, y), batch_size=16, shuffle=True, collate_fn=keep_batch,
                      generator=torch.Generator().manual_seed(5))
    slow = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(5))
    fast_batches, slow_batches = list(fast), list(slow)
    assert len(fast_batches) == len(slow_batches) == 7
    for (fx, fy), (sx, sy) in zip(fast_batches, slow_batches):
        assert torch.equal(fx, sx) and torch.equal(fy, sy)


def test_loader_factory_drop_last_train_only_and_seeded_shuffle():
    x = torch.randn(150, 2)
    y = torch.randint(0, 2, (150,))
    dm = ArrayDataModule(x, y, classes=2, batch_size=32, val_fraction=0.2, drop_last=True, seed=3)
    dm.setup("fit")
    train = dm.train_dataloader()
    assert train.drop_last is True and len(train) == 120 // 32
    assert all(len(b[0]) == 32 for b in train)
    val = dm.val_dataloader()
    assert val.drop_last is False and sum(len(b[0]) for b in val) == 30
    assert train.pin_memory is False  # no trainer on CUDA
    first = [b[1] for b in dm.train_dataloader()]
    again = [b[1] for b in dm.train_dataloader()]
    assert all(torch.equal(a, b) for a, b in zip(first, again))  # same seed and epoch -> same order


class NumpyDrawDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor(np.random.randint(0, 1_000_000))


def test_workers_are_seeded_from_the_data_module_seed():
    dm = ArrayDataModule(torch.randn(8, 1), torch.zeros(8).long(), classes=2, num_workers=2, batch_size=2,
                         val_fraction=0.0, seed=11)
    loader = dm.make_loader(NumpyDrawDataset(), train=True)
    assert loader.persistent_workers is True
    draws = torch.cat(list(loader)).tolist()
    again = torch.cat(list(dm.make_loader(NumpyDrawDataset(), train=True))).tolist()
    assert draws == again  # numpy in workers follows the seed
    assert len(set(draws)) > 1  # and differs between workers/samples


@pytest.mark.parametrize(
    "x, y, kwargs, match",
    [
        (torch.tensor([[0.0], [float("nan")], [1.0], [2.0]]), torch.tensor([0, 1, 0, 1]), {}, "NaN or inf features; first at row 1"),
        (torch.tensor([[0.0], [1.0], [float("inf")], [2.0]]), torch.tensor([0, 1, 0, 1]), {}, "first at row 2"),
        (torch.randn(10, 1), torch.tensor([0, 1, 2, 0, 1, 0, 1, 0, 1, 0]), {}, r"label 2 at row 2 is outside \[0, 1\]"),
        (torch.randn(10, 1), torch.tensor([0, 1] * 5), {"batch_size": 64, "drop_last": True}, "every batch would be dropped"),
        (torch.randn(4, 1), torch.tensor([0, 1, 0, 1]), {"val_fraction": 0.1}, "leaves the val split empty"),
        (torch.empty(0, 1), torch.empty(0).long(), {}, "empty"),
    ],
)
def test_bad_data_is_named_before_training(x, y, kwargs, match):
    kwargs.setdefault("val_fraction", 0.2)
    dm = ArrayDataModule(x, y, classes=2, **kwargs)
    with pytest.raises(ValueError, match=match):
        dm.setup("fit")


def test_missing_split_has_a_clear_error():
    dm = ArrayDataModule(torch.randn(20, 1), torch.tensor([0, 1] * 10), classes=2, val_fraction=0.2)
    with pytest.raises(ValueError, match="there is no test split; set test_fraction > 0"):
        dm.test_dataloader()
    # predict falls back to the val split
    assert sum(len(b[0]) for b in dm.predict_dataloader()) == 4


def test_a_batch_of_indices_becomes_the_same_index_tensor_by_the_quick_path_or_torchs():
    from datamodules.tensor_dataset import index_tensor

    x = torch.randn(20, 3)
    dataset = BatchedTensorDataset(x, torch.arange(20))
    for indices in ([4, 0, 19, 7], [5], torch.tensor([3, 2]), [True, 2]):
        quick = index_tensor(indices)
        assert quick.dtype == torch.long and torch.equal(quick, torch.as_tensor(indices, dtype=torch.long))
    assert index_tensor([]).shape == (0,)
    batch_x, batch_y = dataset.__getitems__([4, 0, 19])
    assert torch.equal(batch_x, x[[4, 0, 19]]) and batch_y.tolist() == [4, 0, 19]
    assert dataset.__getitems__(torch.tensor([1, 2]))[1].tolist() == [1, 2]  # a sampler's tensor batch too
    assert index_tensor([2.0, 1.0]).tolist() == [2, 1]  # not ints: torch's conversion, as before
    quick = index_tensor([1, 2, 3])
    del dataset
    assert quick.tolist() == [1, 2, 3]  # the tensor keeps its buffer alive
