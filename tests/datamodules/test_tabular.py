"""TabularDataModule: encoding, train-only statistics, checkpointed state, bad-input errors, sampling and a fit."""

import copy
import functools

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.base import split_indices
from datamodules.samplers import ClassBalancedSampler
from datamodules.tabular import TabularDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from tests.data_files import make_frame, write

CLASSES = ["ant", "mouse", "zebra"]  # sorted order of the labels below


def label_ids(frame: pd.DataFrame, column: str = "label") -> torch.Tensor:
    """Class ids in the sorted order of the distinct labels, as the data module assigns them."""
    names = sorted(frame[column].unique())
    return torch.tensor([names.index(v) for v in frame[column]])


def position(indices: torch.Tensor, row: int) -> int:
    """Where file row ``row`` sits in a split whose rows are ``indices``."""
    return int(torch.nonzero(indices == row)[0])


def test_classification_encoding(tmp_path):
    frame = make_frame()
    dm = TabularDataModule(str(write(frame, tmp_path / "data.csv")), target="label", test_fraction=0.1, seed=2)
    dm.setup("fit")
    assert dm.class_names == CLASSES and dm.num_classes == 3 and dm.out_features == 3
    assert dm.numeric_columns == ["x1", "x2", "size"] and dm.categorical_columns == ["color"]
    assert dm.vocabularies == {"color": ["blue", "green", "red"]}
    assert dm.feature_names == [
        "x1", "x2", "size", "color=<unknown>", "color=<missing>", "color=blue", "color=green", "color=red"
    ]
    assert dm.in_features == 8 and dm.numeric_features == 3
    assert dm.split_sizes == {"train": 140, "val": 40, "test": 20}
    idx = split_indices(200, 0.2, 0.1, seed=2, labels=label_ids(frame))  # stratified on the sorted label ids
    for split in ("train", "val", "test"):
        x, y = dm.datasets[split].tensors
        assert x.dtype == torch.float32 and x.shape == (len(idx[split]), 8)
        assert y.dtype == torch.int64 and torch.equal(y, label_ids(frame)[idx[split]])
        colors = frame["color"].to_numpy()[idx[split].numpy()]
        for k, value in enumerate(["blue", "green", "red"]):
            assert torch.equal(x[:, 5 + k], torch.tensor(colors == value, dtype=torch.float32))
        assert x[:, 3].sum().item() == 0 and x[:, 4].sum().item() == 0  # every color was seen in train, none missing
    assert dm.class_counts == torch.bincount(label_ids(frame)[idx["train"]]).tolist()


def test_integer_labels_are_sorted_by_value(tmp_path):
    frame = make_frame()
    frame["label"] = np.tile([10, 2, 3, 2], 50)
    dm = TabularDataModule(str(write(frame, tmp_path / "data.csv")), target="label")
    assert dm.class_names == ["2", "3", "10"]  # read lazily, by value (not "10" < "2")
    y = torch.cat([dm.datasets[s].tensors[1] for s in ("train", "val")])
    assert sorted(torch.bincount(y).tolist()) == [50, 50, 100]
    assert torch.bincount(y).tolist() == [100, 50, 50]


def test_unknown_categories_map_to_the_unknown_column_and_missing_ones_to_the_missing_column(tmp_path):
    frame = make_frame(n=200, seed=1)
    idx = split_indices(200, 0.2, 0.1, seed=0, labels=label_ids(frame))
    val_row, test_row, train_row = int(idx["val"][3]), int(idx["test"][0]), int(idx["train"][5])
    frame.loc[val_row, "color"] = "purple"  # only in the val split
    frame.loc[test_row, "color"] = "orange"  # only in the test split
    frame.loc[train_row, "color"] = None  # missing: its own slot, and never a vocabulary entry
    dm = TabularDataModule(str(write(frame, tmp_path / "data.csv")), target="label", test_fraction=0.1)
    dm.setup("fit")
    assert dm.vocabularies["color"] == ["blue", "green", "red"]
    names = dm.feature_names
    unknown = names.index("color=<unknown>")
    assert names[unknown + 1] == "color=<missing>"
    block = slice(unknown, unknown + 5)
    for split, row, slots in (("val", val_row, [1.0, 0.0, 0.0, 0.0, 0.0]), ("test", test_row, [1.0, 0.0, 0.0, 0.0, 0.0]),
                              ("train", train_row, [0.0, 1.0, 0.0, 0.0, 0.0])):
        x = dm.datasets[split].tensors[0][position(idx[split], row)]
        assert x[block].tolist() == slots, split
    strict = TabularDataModule(str(tmp_path / "data.csv"), target="label", test_fraction=0.1, missing="error")
    assert "color=<missing>" not in strict.feature_names
    x = strict.datasets["train"].tensors[0][position(idx["train"], train_row)]
    assert x[unknown : unknown + 4].tolist() == [1.0, 0.0, 0.0, 0.0]  # missing="error": the <unknown> slot
    val_x = dm.datasets["val"].tensors[0]
    assert val_x[:, unknown].sum().item() == 1.0 and torch.equal(val_x[:, block].sum(1), torch.ones(len(val_x)))


def test_numeric_statistics_come_from_the_train_split_only(tmp_path):
    frame = make_frame(n=300, seed=2)
    idx = split_indices(300, 0.2, 0.0, seed=0, labels=label_ids(frame))
    frame.loc[idx["val"].numpy(), "x1"] += 50.0  # the val split has a clearly different mean
    dm = TabularDataModule(str(write(frame, tmp_path / "data.csv")), target="label")
    dm.setup("fit")
    raw = torch.tensor(frame[["x1", "x2", "size"]].to_numpy(dtype=np.float64))
    train_raw = raw[idx["train"]]
    mean, std = train_raw.mean(0), train_raw.std(0, unbiased=False)
    assert torch.allclose(dm.standardizer.mean, mean) and torch.allclose(dm.standardizer.std, std)
    assert abs(dm.standardizer.mean[0].item() - raw[:, 0].mean().item()) > 5.0  # not the whole file's mean
    train_x, val_x = dm.datasets["train"].tensors[0][:, :3], dm.datasets["val"].tensors[0][:, :3]
    assert train_x.mean(0).abs().max().item() < 1e-5
    assert torch.allclose(train_x.std(0, unbiased=False), torch.ones(3), atol=1e-4)
    assert val_x[:, 0].mean().item() > 40.0  # transformed with the train statistics, not its own
    assert torch.allclose(val_x, ((raw[idx["val"]] - mean) / std).float(), atol=1e-5)


def test_csv_and_parquet_give_identical_tensors(tmp_path):
    frame = make_frame(n=150, seed=3)
    frame.loc[7, "color"] = None
    modules = [
        TabularDataModule(str(write(frame, tmp_path / name)), target="label", test_fraction=0.2, seed=4)
        for name in ("data.csv", "data.parquet", "data.pq")
    ]
    for dm in modules:
        dm.setup("fit")
    first = modules[0]
    for other in modules[1:]:
        assert other.feature_names == first.feature_names and other.class_names == first.class_names
        assert other.state_dict() == first.state_dict()
        for split in ("train", "val", "test"):
            for a, b in zip(first.datasets[split].tensors, other.datasets[split].tensors):
                assert torch.equal(a, b), split


def test_regression(tmp_path):
    frame = make_frame(n=120, seed=4)
    frame["y"] = 2.0 * frame["x1"] - frame["x2"]
    dm = TabularDataModule(str(write(frame, tmp_path / "data.parquet")), target="y", task="regression", seed=1)
    dm.setup("fit")
    assert dm.num_classes is None and dm.class_names is None and dm.out_features == 1 and dm.class_counts is None
    assert dm.categorical_columns == ["color", "label"]  # a string label is just another categorical feature here
    assert dm.in_features == 3 + 5 + 5  # blocks: <unknown>, <missing> and the 3 values
    idx = split_indices(120, 0.2, 0.0, seed=1)  # not stratified
    for split in ("train", "val"):
        y = dm.datasets[split].tensors[1]
        assert y.dtype == torch.float32 and y.shape == (len(idx[split]),)
        assert torch.equal(y, torch.tensor(frame["y"].to_numpy()[idx[split].numpy()], dtype=torch.float32))
    assert dm.state_dict()["class_names"] is None


def test_label_mapping_and_encoding_survive_state_dict(tmp_path):
    frame = make_frame(n=200, seed=5)
    dm = TabularDataModule(str(write(frame, tmp_path / "train.csv")), target="label")
    dm.setup("fit")
    state = dm.state_dict()
    assert state["class_names"] == CLASSES and state["vocabularies"] == {"color": ["blue", "green", "red"]}
    # another file: only two of the labels (a fresh fit would call them 0 and 1), a new color, other statistics
    other = make_frame(n=60, seed=6)
    other["label"] = np.tile(["zebra", "mouse"], 30)
    other.loc[0, "color"] = "purple"
    other["x1"] += 3.0
    fresh = TabularDataModule(str(write(other, tmp_path / "new.csv")), target="label", seed=9)
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.datasets == {}  # known without reading the file
    assert fresh.class_names == CLASSES and fresh.num_classes == 3
    assert fresh.feature_names == dm.feature_names and fresh.in_features == dm.in_features
    fresh.setup("fit")
    assert fresh.state_dict() == state
    assert torch.equal(fresh.standardizer.mean, dm.standardizer.mean)
    x = torch.cat([fresh.datasets[s].tensors[0] for s in ("train", "val")])
    y = torch.cat([fresh.datasets[s].tensors[1] for s in ("train", "val")])
    assert sorted(torch.unique(y).tolist()) == [1, 2]  # mouse, zebra in the checkpoint's numbering
    assert x[:, fresh.feature_names.index("color=<unknown>")].sum().item() == 1.0
    # a label the checkpoint does not know is an error naming it
    other.loc[4, "label"] = "yak"
    stranger = TabularDataModule(str(write(other, tmp_path / "yak.csv")), target="label")
    stranger.load_state_dict(copy.deepcopy(state))
    with pytest.raises(ValueError, match=r"label 'yak' at row 4 .* not one of the checkpoint's classes"):
        stranger.setup("fit")


def test_lightning_checkpoint_keeps_the_encoding(tmp_path):
    frame = make_frame(n=200, seed=7)
    path = str(write(frame, tmp_path / "data.csv"))
    dm = TabularDataModule(path, target="label", seed=0)
    module = ClassificationModule(MLP(8, 3, [8]), num_classes=3)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=True)["TabularDataModule"]
    assert saved == dm.state_dict() and saved["class_names"] == CLASSES
    # another seed gives other train statistics; validating from the checkpoint re-encodes with the saved ones
    other = TabularDataModule(path, target="label", seed=1)
    trainer.validate(module, datamodule=other, ckpt_path=ckpt, verbose=False)
    assert other.state_dict() == saved
    expected = TabularDataModule(path, target="label", seed=1)
    expected.load_state_dict(saved)
    expected.setup("validate")
    assert torch.equal(other.datasets["val"].tensors[0], expected.datasets["val"].tensors[0])


def _set(frame, row, column, value):
    frame[column] = frame[column].astype(object)
    frame.loc[row, column] = value
    return frame


ERRORS = [
    # (name, file name, mutate frame or raw bytes, kwargs, exception, match)
    ("suffix", "data.txt", None, {}, ValueError, r"suffix '\.txt'.*\.csv, \.parquet or \.pq"),
    ("empty", "data.csv", b"", {}, ValueError, r"'.*data\.csv' is empty"),
    ("header only", "data.csv", b"x1,label\n", {}, ValueError, r"data\.csv' has no data rows"),
    ("unreadable", "data.parquet", b"not a parquet file", {}, ValueError, r"cannot read '.*data\.parquet' as Parquet"),
    ("no target", "data.csv", None, {"target": "species"}, ValueError,
     r"target column 'species' is not in '.*data\.csv'; available columns: \['x1', 'color'"),
    ("no feature", "data.parquet", None, {"features": ["x1", "weight"]}, ValueError,
     r"feature column\(s\) \['weight'\] are not in '.*data\.parquet'; available columns: \['x1', 'color'"),
    ("text in numeric", "data.csv", lambda f: _set(f, 7, "x2", "abc"), {"categorical": ["color"]}, ValueError,
     r"column 'x2' of '.*data\.csv' is treated as numeric but has the non-numeric value 'abc' at row 7.*"
     r"add 'x2' to categorical"),
    ("string column not categorical", "data.csv", None, {"categorical": []}, ValueError,
     r"column 'color' .* non-numeric value '(red|green|blue)' at row 0 .*add 'color' to categorical"),
    ("nan in numeric", "data.csv", lambda f: _set(f, 5, "x1", None), {"missing": "error"}, ValueError,
     r"numeric column 'x1' of '.*data\.csv' has a missing value \(NaN\) at row 5 .*fill or drop those rows, or set "
     r"missing: impute \(--data.init_args.missing impute\)"),
    ("inf in numeric", "data.parquet", lambda f: _set(f, 6, "x2", float("inf")), {}, ValueError,
     r"numeric column 'x2' of '.*data\.parquet' has the value inf at row 6"),
    ("missing target", "data.csv", lambda f: _set(f, 4, "label", None), {}, ValueError,
     r"target column 'label' of '.*data\.csv' has 1 missing value\(s\); first at row 4"),
    ("text regression target", "data.csv", None, {"task": "regression"}, ValueError,
     r"task='regression' needs a numeric target, but column 'label' of '.*data\.csv' has '(ant|mouse|zebra)' at row 0"),
    ("float class labels", "data.csv", None, {"target": "x1"}, ValueError,
     r"classification target 'x1' .* non-integer value .* at row 0.*task='regression'"),
    ("one class", "data.csv", lambda f: f.assign(label="ant"), {}, ValueError, r"only the label\(s\) \['ant'\]"),
    ("balance regression", "data.csv", None, {"target": "x1", "task": "regression", "class_balance": True},
     ValueError, "class_balance=True needs class labels"),
    ("stray categorical", "data.csv", None, {"features": ["x1"], "categorical": ["color"]}, ValueError,
     r"categorical lists \['color'\], which are not in features \['x1'\]"),
]


@pytest.mark.parametrize("name, file, content, kwargs, error, match", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_input_is_named_and_the_file_is_untouched(tmp_path, name, file, content, kwargs, error, match):
    path = tmp_path / file
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        frame = make_frame(n=40)
        frame = content(frame) if content is not None else frame
        if path.suffix == ".parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
    before = path.read_bytes()
    with pytest.raises(error, match=match):
        TabularDataModule(str(path), **{"target": "label", **kwargs}).setup("fit")
    assert path.read_bytes() == before


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data file '.*nope\.csv' does not exist"):
        TabularDataModule(str(tmp_path / "nope.csv"), target="label").setup()  # read at setup (recipes: when built)


def test_class_balance_draws_the_minority_half_of_the_time(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=1000), "label": ["common"] * 900 + ["rare"] * 100})
    path = str(write(frame, tmp_path / "data.csv"))
    balanced = TabularDataModule(path, target="label", class_balance=True, batch_size=100, seed=3)
    loader = balanced.train_dataloader()
    assert isinstance(loader.sampler, ClassBalancedSampler)
    drawn = torch.cat([y for _, y in loader])
    assert len(drawn) == 800 and balanced.class_counts == [720, 80]
    share = (drawn == balanced.class_names.index("rare")).double().mean().item()
    assert abs(share - 0.5) < 0.05, share
    plain = TabularDataModule(path, target="label", batch_size=100, seed=3)
    loader = plain.train_dataloader()
    assert not isinstance(loader.sampler, ClassBalancedSampler)
    assert (torch.cat([y for _, y in loader]) == 1).double().mean().item() == pytest.approx(0.1)


def test_workers_give_the_same_batches(tmp_path):
    path = str(write(make_frame(n=300), tmp_path / "data.csv"))
    batches = {}
    for workers in (0, 2):
        dm = TabularDataModule(path, target="label", batch_size=32, num_workers=workers, seed=5)
        loader = dm.train_dataloader()
        assert loader.num_workers == workers and loader.persistent_workers == (workers > 0)
        batches[workers] = list(loader)
        del loader
    assert len(batches[0]) == len(batches[2]) == 8
    for (x0, y0), (x2, y2) in zip(batches[0], batches[2]):
        assert torch.equal(x0, x2) and torch.equal(y0, y2)


def test_mlp_learns_a_separable_table(tmp_path):
    rng = np.random.default_rng(1)
    n = 600
    frame = pd.DataFrame({"x1": rng.normal(size=n), "x2": rng.normal(size=n),
                          "color": rng.choice(["red", "green", "blue"], size=n)})
    frame["label"] = np.where(frame["color"] == "red", "stop", np.where(frame["x1"] + frame["x2"] > 0, "go", "wait"))
    L.seed_everything(0, verbose=False)
    dm = TabularDataModule(str(write(frame, tmp_path / "data.csv")), target="label", batch_size=64)
    assert dm.class_names == ["go", "stop", "wait"] and dm.in_features == 7
    module = ClassificationModule(MLP(dm.in_features, dm.num_classes, [32]), num_classes=dm.num_classes,
                                  optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    trainer = L.Trainer(max_epochs=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(module, datamodule=dm)
    accuracy = trainer.callback_metrics["val/acc"].item()
    assert accuracy > 0.9, accuracy
