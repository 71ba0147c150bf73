"""StreamingTableDataModule: Parquet row groups streamed, split by a hash, every train row once per epoch over loader
workers and processes (except the documented remainder), shuffled well from a file sorted by label, resumed exactly
mid-epoch (loader level, and a real kill -9 of a 2-process DDP fit with 2 loader workers each), bad input in one
line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from datamodules import streaming_table
from datamodules.parquet_source import ParquetSource
from datamodules.stream_order import TrainPlan, row_hashes, split_codes
from datamodules.streaming_table import StreamingTableDataModule, StreamingTableDataset

ROOT = Path(__file__).resolve().parents[2]


def write_table(path: Path, rows: int, group_rows: int, *, sorted_labels: bool = False, seed: int = 0) -> pd.DataFrame:
    """A table with an ``id`` column (the row number), a number with gaps, a category and a label ``y``."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, rows)
    frame = pd.DataFrame({
        "id": np.arange(rows, dtype=np.int64),
        "x": rng.normal(size=rows),
        "c": rng.choice(["a", "b", "c"], rows),
        "y": np.sort(labels) if sorted_labels else labels,
    })
    frame.loc[::7, "x"] = np.nan
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=group_rows)
    return frame


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    path = tmp_path_factory.mktemp("stream") / "t.parquet"
    return path, write_table(path, 20_000, 500)


def raw_ids(module: StreamingTableDataModule, features: torch.Tensor) -> np.ndarray:
    """The ``id`` column back from its standardized position 0."""
    scaler = module.encoder.scaler  # type: ignore[union-attr]
    mean, std = float(scaler.mean[0]), float(scaler.std[0])  # type: ignore[attr-defined]
    return np.rint(features[:, 0].double().numpy() * std + mean).astype(np.int64)


def test_the_split_is_a_stable_hash_of_the_key_or_row_number():
    ids = np.arange(100_000)
    codes = split_codes(row_hashes(ids, 0), 0.1, 0.2)
    shares = np.bincount(codes, minlength=3) / len(ids)
    assert abs(shares[1] - 0.1) < 0.005 and abs(shares[2] - 0.2) < 0.005
    assert np.array_equal(codes[5000:6000], split_codes(row_hashes(ids[5000:6000], 0), 0.1, 0.2))  # row by row
    assert not np.array_equal(codes, split_codes(row_hashes(ids, 1), 0.1, 0.2))  # the seed changes it
    users = np.repeat(np.array([f"user{i}" for i in range(500)]), 7)  # every row of one key: one split
    user_codes = split_codes(row_hashes(users, 0), 0.1, 0.2).reshape(500, 7)
    assert (user_codes == user_codes[:, :1]).all()


def test_setup_counts_splits_labels_and_fits_the_encoding_from_metadata_and_a_sample(table):
    path, frame = table
    module = StreamingTableDataModule(str(path), "y", features=["id", "x", "c"], fit_rows=3000, batch_size=64)
    module.setup()
    # pinned: a row's split must not move between machines or library versions
    assert module.split_sizes == {"train": 16_086, "val": 1_962, "test": 1_952}
    codes = split_codes(row_hashes(frame["id"].to_numpy(), 0), 0.1, 0.1)
    assert module.split_sizes == {"train": int((codes == 0).sum()), "val": int((codes == 1).sum()),
                                  "test": int((codes == 2).sum())}
    assert sum(module.split_sizes.values()) == len(frame)
    assert module.class_names == ["0", "1"] and module.in_features == 8
    assert module.feature_names == ["id", "x", "x=<missing>", "c=<unknown>", "c=<missing>", "c=a", "c=b", "c=c"]
    assert module.numeric_features == 2
    # the size of an epoch is known before the first step: whole batches, the same on every process
    assert len(module.train_dataloader()) == 16_086 // 64


@pytest.mark.parametrize("world", [1, 2])
def test_every_train_row_is_read_once_per_epoch_over_4_workers_and_processes(table, monkeypatch, world):
    path, _ = table
    module = StreamingTableDataModule(str(path), "y", features=["id", "x", "c"], batch_size=64, window=2048,
                                      num_workers=4)
    module.setup()
    train_rows = module.split_sizes["train"]
    seen: list[np.ndarray] = []
    steps = []
    for rank in range(world):
        monkeypatch.setattr(streaming_table, "process_rank", lambda rank=rank: (rank, world))
        loader = module.train_dataloader()
        batches = list(loader)
        steps.append(len(batches))
        assert len(batches) == len(loader) and all(len(b[1]) == 64 for b in batches)
        seen.append(np.concatenate([raw_ids(module, b[0]) for b in batches]))
    ids = np.concatenate(seen)
    plan = TrainPlan(train_rows, 64, world)
    assert steps == [plan.steps] * world  # every process runs the same number of steps
    assert len(np.unique(ids)) == len(ids)  # no row twice
    left_out = train_rows - len(ids)
    assert left_out == plan.remainder and left_out < world + world * 64  # the documented remainder
    codes = split_codes(row_hashes(ids, 0), module.val_fraction, module.test_fraction)
    assert (codes == 0).all()  # train rows only
    # validation: every row once, in file order, over processes and workers
    val = []
    for rank in range(world):
        monkeypatch.setattr(streaming_table, "process_rank", lambda rank=rank: (rank, world))
        val.append(np.concatenate([raw_ids(module, b[0]) for b in module.val_dataloader()]))
    assert len(np.concatenate(val)) == module.split_sizes["val"] == len(np.unique(np.concatenate(val)))


@pytest.mark.parametrize("workers", [0, 3])
def test_a_pass_started_mid_epoch_is_the_rest_of_the_uninterrupted_pass(table, workers):
    path, _ = table
    module = StreamingTableDataModule(str(path), "y", features=["id", "x", "c"], batch_size=64, window=1024,
                                      num_workers=workers)
    loader = module.train_dataloader()
    first, second = list(loader), list(loader)  # epochs 0 and 1
    assert not torch.equal(first[0][0], second[0][0])  # each epoch its own order
    for done in (1, 37, 100):
        resumed = module.train_dataloader()  # a new process: the loader's state from the checkpoint
        resumed.load_state_dict({"epoch": 1, "batches": done})
        rest = list(resumed)
        assert len(rest) == len(second) - done
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, second[done:]))
        assert resumed.state_dict() == {"epoch": 1, "batches": len(second)}


class RowNumbers:
    """A stand-in reader: a piece's rows are their row numbers (features) and labels, without Parquet decoding."""

    def __init__(self, labels: np.ndarray, group_rows: int) -> None:
        self.labels, self.group_rows = labels, group_rows

    def encode(self, pieces):
        rows = np.concatenate([np.arange(p.start, p.stop) + p.group * self.group_rows for p in pieces])
        return torch.from_numpy(rows), torch.from_numpy(self.labels[rows])


@pytest.mark.slow
def test_a_file_sorted_by_label_is_shuffled_well_with_the_default_window(tmp_path):
    """1M rows sorted by label (10 classes) in 1,000 row groups, the default window: in every 1,000 consecutive
    samples each class's share within 5 points of the file's, and the mean |rank correlation| of a row's place in the epoch with its place in
    the file below 0.05 over 10 seeds. The order is the module's (``StreamingTableDataset`` with the real order);
    the rows are stood in by their numbers, so the test does not decode 10M rows."""
    from scipy.stats import spearmanr

    rows, group_rows, classes = 1_000_000, 1_000, 10
    # 10 classes: with 2 classes of 50% even a perfect permutation misses 5 points (one window's share has a standard
    # deviation of 1.6 points; the largest of 1,000 windows is about 5.2)
    labels = np.sort(np.random.default_rng(0).integers(0, classes, rows))
    shares = np.bincount(labels, minlength=classes) / rows
    counts = np.full(rows // group_rows, group_rows)  # every row in the train split, to test the order alone
    correlations, worst = [], 0.0
    for seed in range(10):
        dataset = StreamingTableDataset(RowNumbers(labels, group_rows), counts, 1000, seed,  # type: ignore[arg-type]
                                        streaming_table.DEFAULT_WINDOW, shuffle=True)
        order = torch.cat([b[0] for b in dataset]).numpy()
        windows = labels[order].reshape(-1, 1000)
        mix = np.stack([(windows == c).mean(axis=1) for c in range(classes)], axis=1)
        worst = max(worst, float(np.abs(mix - shares).max()))
        correlations.append(abs(spearmanr(np.arange(len(order)), order).statistic))
    assert worst < 0.05, worst
    assert np.mean(correlations) < 0.05, correlations


def test_bad_input_is_one_line(tmp_path, table):
    path, _ = table
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no table here")
    with pytest.raises(FileNotFoundError, match="holds no Parquet file"):
        ParquetSource(str(empty))
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"a": [1, 2], "y": [0, 1]}), mixed / "part-0.parquet")
    pq.write_table(pa.table({"a": ["x", "y"], "y": [0, 1]}), mixed / "part-1.parquet")
    with pytest.raises(ValueError, match=r"part-1.parquet' has the columns \[a: string, y: int64\] but"):
        ParquetSource(str(mixed))
    (tmp_path / "fake.parquet").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="cannot read .*fake.parquet' as Parquet"):
        ParquetSource(str(tmp_path / "fake.parquet"))
    with pytest.raises(ValueError, match="the target column 'label' is not in") as error:
        StreamingTableDataModule(str(path), "label").setup()
    assert "\n" not in str(error.value)
    with pytest.raises(FileNotFoundError, match="no file matches"):
        ParquetSource(str(tmp_path / "nothing-*.parquet"))


def test_a_folder_or_glob_of_files_is_one_table_in_file_order(tmp_path):
    frame = write_table(tmp_path / "whole.parquet", 3_000, 250)
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(3):
        pq.write_table(pa.Table.from_pandas(frame.iloc[i * 1000 : (i + 1) * 1000], preserve_index=False),
                       parts / f"part-{i}.parquet", row_group_size=250)
    folder, glob = ParquetSource(str(parts)), ParquetSource(str(parts / "part-*.parquet"))
    whole = ParquetSource(str(tmp_path / "whole.parquet"))
    assert folder.rows == glob.rows == whole.rows == 3_000 and folder.groups == 12
    assert folder.fingerprint == glob.fingerprint != whole.fingerprint
    split = {}
    for name, source in (("whole", tmp_path / "whole.parquet"), ("parts", parts)):
        module = StreamingTableDataModule(str(source), "y", features=["id", "x", "c"], batch_size=50)
        module.setup()
        split[name] = module.split_sizes
    assert split["whole"] == split["parts"]  # the same rows, the same splits


@pytest.mark.slow
def test_kill_9_mid_epoch_on_two_processes_with_workers_resumes_to_bit_identical_weights(tmp_path):
    """A plain ``lightning.Trainer`` fit on 2 DDP processes with 2 loader workers each, killed with SIGKILL (the
    whole process group) as step 8 of epoch 1 of 2 starts (``last.ckpt`` every 3 steps), resumed from it, ends with
    the weights of the uninterrupted fit, bit for bit."""
    path = tmp_path / "t.parquet"
    write_table(path, 1_200, 50)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def fit(out: Path, *extra: str, expect: int = 0) -> None:
        out.mkdir()
        done = subprocess.run([sys.executable, "-m", "tests.datamodules.streaming_fit", str(path), str(out), *extra],
                              cwd=out, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
        assert done.returncode == expect, done.stderr[-3000:]

    fit(tmp_path / "whole")
    steps = torch.load(tmp_path / "whole" / "steps.pt") // 2  # per epoch
    fit(tmp_path / "killed", str(steps + 8), expect=-9)
    checkpoint = torch.load(tmp_path / "killed" / "last.ckpt", weights_only=False)
    step = checkpoint["global_step"]
    assert checkpoint["epoch"] == 1 and steps < step <= steps + 8  # mid-epoch 1: the newest of every 3 steps
    assert checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"] == [{"epoch": 1, "batches": step - steps}]
    fit(tmp_path / "resumed", "-", str(tmp_path / "killed" / "last.ckpt"))
    whole, resumed = (torch.load(tmp_path / name / "weights.pt") for name in ("whole", "resumed"))
    assert torch.load(tmp_path / "resumed" / "steps.pt") == torch.load(tmp_path / "whole" / "steps.pt")
    assert whole.keys() == resumed.keys()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name
