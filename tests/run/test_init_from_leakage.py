"""Leakage through initial weights (issue 31, point 6): ``init_from`` a run trained on the same table with another
seed warns in one line with the exact counts of this run's validation and test rows that were its training rows,
and tags the run; the same seed overlaps nothing; another table is not compared at all.

The expected counts are computed here from the two splits themselves (two ``TabularDataModule`` set up with each
seed, their ``split_rows``), not by the code under test."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from datamodules.spiral import SpiralDataModule
from datamodules.tabular import TabularDataModule
from recipes.cli import main
from recipes.callbacks.init_from_overlap import OVERLAP_TAG, Overlap, init_from_overlap
from tests.conftest import CONFIGS, runs_of

TABULAR = CONFIGS / "tabular_mlp.yaml"
ROWS, FRACTION = 200, 0.3  # 60 validation and 60 test rows
SPLIT = ["--data.init_args.val_fraction", str(FRACTION), "--data.init_args.test_fraction", str(FRACTION)]
FAST = ["--trainer.max_epochs", "1", "--trainer.log_every_n_steps", "1", "--mlflow_model", "false",
        "--data.init_args.target", "label", "--data.init_args.categorical", "[c]", *SPLIT]


def write_table(path: Path, seed: int) -> Path:
    """A small table of two numeric columns, one categorical and a binary label (distinct rows)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"a": rng.normal(size=ROWS), "b": rng.normal(size=ROWS), "c": rng.choice(["x", "y"], ROWS)})
    frame["label"] = np.where(frame.a + frame.b > 0, "p", "n")
    frame.to_csv(path, index=False)
    return path


def fit(table: Path, seed: int, init_from: str | None = None) -> tuple[str, str, dict[str, str]]:
    """One tiny fit; its stdout, stderr and run tags."""
    out, err = io.StringIO(), io.StringIO()
    extra = ["--model.init_args.init_from", init_from] if init_from else []
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        main(["fit", "-c", str(TABULAR), "--data.init_args.path", str(table), "--data.init_args.seed", str(seed),
              *FAST, *extra])
    return out.getvalue(), err.getvalue(), runs_of(Path.cwd(), "tabular_mlp")[-1].data.tags


def split_rows(table: Path, seed: int) -> dict[str, set[int]]:
    data = TabularDataModule(str(table), target="label", categorical=["c"], val_fraction=FRACTION,
                             test_fraction=FRACTION, seed=seed)
    data.setup("fit")
    return {split: set(rows.tolist()) for split, rows in data.split_rows.items()}


@pytest.fixture(scope="module")
def fits(clean_workdir):
    """The starting run (seed 0) and fits from its best checkpoint: seed 1 (run: and mlflow:), seed 0, another table."""
    with clean_workdir("init_from_leakage") as directory:
        table, other = write_table(directory / "table.csv", 0), write_table(directory / "other.csv", 1)
        fit(table, 0)
        start = runs_of(directory, "tabular_mlp")[0].info.run_id
        reference = f"run:{start}/best"
        yield {
            "directory": directory, "table": table, "reference": reference, "start": start,
            "ckpt": directory / "checkpoints" / "tabular_mlp" / start / "best.ckpt",
            "other_seed": fit(table, 1, reference),
            "other_seed_mlflow": fit(table, 1, f"mlflow:{start}/best"),
            "same_seed": fit(table, 0, reference),
            "other_table": fit(other, 0, reference),
        }


def test_another_seed_warns_once_with_the_exact_counts_and_tags_the_run(fits):
    trained = split_rows(fits["table"], 0)["train"]
    now = split_rows(fits["table"], 1)
    val, test = len(now["val"] & trained), len(now["test"] & trained)
    assert len(now["val"]) == len(now["test"]) == 60 and val > 0 and test > 0
    out, err, tags = fits["other_seed"]
    # the fetched file is announced under the setting that named it, not as --ckpt_path
    assert f"recipes: init_from {fits['reference']} = " in out and "--ckpt_path" not in out, out
    warnings = [line for line in err.splitlines() if "init_from" in line and "warning" in line]
    assert warnings == [
        f"recipes: warning: init_from {fits['reference']} was trained on {val} of this run's 60 validation rows and "
        f"{test} of its 60 test rows (same data, seed 1 vs 0; compared by row ids): val/test scores of this run are "
        "not held-out estimates; use the same seed and fractions as the starting run, or start from weights that "
        "never saw this table"
    ], err
    assert tags[OVERLAP_TAG] == f"val {val}/60, test {test}/60"
    # the store's copy of the same checkpoint (mlflow:<id>/best, downloaded) is compared the same way
    _, err, tags = fits["other_seed_mlflow"]
    assert tags[OVERLAP_TAG] == f"val {val}/60, test {test}/60" and f"init_from mlflow:{fits['start']}/best was" in err


def test_the_same_seed_overlaps_nothing_and_says_so_only_in_the_tag(fits):
    _, err, tags = fits["same_seed"]
    assert "trained on" not in err
    assert tags[OVERLAP_TAG] == "val 0/60, test 0/60"


def test_another_table_is_not_compared(fits):
    out, err, tags = fits["other_table"]
    assert "trained on" not in err + out and OVERLAP_TAG not in tags
    assert tags["loopwise.init_from"] == fits["reference"]  # the weights were loaded all the same


def test_rows_compared_by_content_count_the_same_and_a_large_source_is_not_rebuilt(fits, monkeypatch):
    """A data module without ``split_rows`` is compared by content, with this run's encoding; the counts are the
    row ids' counts. A source above the bound is one line saying it was not checked."""
    monkeypatch.chdir(fits["directory"])

    class NoRowIds(TabularDataModule):
        @property
        def split_rows(self) -> dict:
            return {}

        @split_rows.setter
        def split_rows(self, value: dict) -> None:
            pass

    data = NoRowIds(str(fits["table"]), target="label", categorical=["c"], val_fraction=FRACTION,
                    test_fraction=FRACTION, seed=1)
    data.setup("fit")
    overlap = init_from_overlap("x", fits["ckpt"], data)
    expected = fits["other_seed"][2][OVERLAP_TAG]
    assert isinstance(overlap, Overlap) and overlap.compared_by == "row content" and overlap.tag() == expected
    skipped = init_from_overlap("x", fits["ckpt"], data, max_rows=100)
    assert skipped == ("init_from x was trained on this run's data; its training split is not rebuilt for 200 rows "
                       "(more than 100): whether this run's val/test rows were among them is not checked")


def fake_checkpoint(path: Path, settings: dict, data: dict | None) -> Path:
    """A checkpoint holding only what the check reads: the data settings and (when given) ``loopwise_data``."""
    content = {"datamodule_hyper_parameters": settings, **({"loopwise_data": data} if data is not None else {})}
    torch.save(content, path)
    return path


def test_an_older_checkpoint_is_compared_by_the_digest_of_its_recorded_file(fits, monkeypatch, tmp_path):
    """Without ``loopwise_data``: the file its settings name, when it is there; a file that is gone compares nothing."""
    monkeypatch.chdir(fits["directory"])
    settings = torch.load(fits["ckpt"], weights_only=True)["datamodule_hyper_parameters"]
    data = TabularDataModule(str(fits["table"]), target="label", categorical=["c"], val_fraction=FRACTION,
                             test_fraction=FRACTION, seed=1)
    data.setup("fit")
    older = init_from_overlap("x", fake_checkpoint(tmp_path / "older.ckpt", settings, None), data)
    assert isinstance(older, Overlap) and older.tag() == fits["other_seed"][2][OVERLAP_TAG]
    gone = fake_checkpoint(tmp_path / "gone.ckpt", {**settings, "path": str(tmp_path / "moved.csv")}, None)
    assert init_from_overlap("x", gone, data) is None


def test_generated_data_is_the_same_source_when_only_the_split_fractions_differ(tmp_path):
    """Spiral points are generated from the seed: another val_fraction overlaps (counted by row ids, here computed
    from the two data modules' own splits); another seed is other points, not compared."""
    def spiral(**kwargs: object) -> SpiralDataModule:
        data = SpiralDataModule(n_samples=300, **kwargs)
        data.setup("fit")
        return data

    start, now = spiral(seed=0, val_fraction=0.2), spiral(seed=0, val_fraction=0.4)
    expected = {split: (int(torch.isin(now.split_rows[split], start.split_rows["train"]).sum()),
                        len(now.split_rows[split])) for split in ("val", "test")}
    assert expected["val"][0] > 0 and expected["test"][1] > 0  # SpiralDataModule keeps a test split by default
    settings = {"_class_path": "datamodules.SpiralDataModule", **dict(start.hparams)}
    ckpt = fake_checkpoint(tmp_path / "spiral.ckpt", settings, {"source": None, "splits": {}})
    overlap = init_from_overlap("x", ckpt, now)
    assert isinstance(overlap, Overlap) and overlap.counts == expected
    assert [c.name for c in overlap.changes] == ["val_fraction"]
    assert init_from_overlap("x", ckpt, spiral(seed=1, val_fraction=0.4)) is None


def test_a_split_that_cannot_be_rebuilt_is_one_line_and_the_fit_goes_on(fits, monkeypatch, tmp_path):
    """The starting run's settings that this run's data class cannot set up (here: a target the file lacks)."""
    monkeypatch.chdir(fits["directory"])
    settings = torch.load(fits["ckpt"], weights_only=True)["datamodule_hyper_parameters"]
    data = TabularDataModule(str(fits["table"]), target="label", categorical=["c"], val_fraction=FRACTION,
                             test_fraction=FRACTION, seed=1)
    data.setup("fit")
    ckpt = fake_checkpoint(tmp_path / "other_target.ckpt", {**settings, "target": "nope"}, None)
    line = init_from_overlap("x", ckpt, data)
    assert isinstance(line, str) and line.startswith("init_from x: its training split could not be rebuilt to "
                                                     "compare rows (") and "nope" in line and "\n" not in line
