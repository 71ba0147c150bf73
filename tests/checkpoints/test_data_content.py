"""The data guard compares the source's content, not its path (issue 31 point 1).

One small tabular fit is shared by every case. Its file edited in place (rows reordered, rows appended, replaced by
another table) is refused in one line naming both digests; the same bytes under another name are accepted;
``--allow_data_change true`` evaluates and tags; a checkpoint without the digests (an older loopwise's) keeps the old
comparison of the path's text; ``last`` skips the run whose source content differs.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from recipes.checkpoints.data_content import DATA_KEY, SPLIT_TAG
from recipes.checkpoints.data_guard import ContentChange, DataChange, DataSettingsChanged, guard_data_settings
from recipes.cli import main
from recipes.tracking import dataset_inputs
from recipes.tracking.dataset_inputs import file_digest
from tests.conftest import CONFIGS, REPO, runs_of

TABULAR = CONFIGS / "tabular_mlp.yaml"
EXPERIMENT = "tabular_mlp"
DATA = "table.csv"
TINY = [
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
    "--mlflow_model", "false", "--system_metrics_interval", "0",
]
CHURN = (REPO / "data" / "churn.csv").read_text().splitlines(keepends=True)
HEADER, ROWS = CHURN[0], CHURN[1:401]


@pytest.fixture(scope="module")
def trained(clean_workdir) -> Iterator[dict]:
    """One tabular fit on ``table.csv`` (400 churn rows) in its own directory: the directory, run id, last.ckpt."""
    with clean_workdir("data_content") as directory:
        (directory / DATA).write_text(HEADER + "".join(ROWS))
        main(["fit", "-c", str(TABULAR), *TINY, "--data.init_args.path", DATA])
        (run,) = runs_of(directory, EXPERIMENT)
        last = directory / "checkpoints" / EXPERIMENT / run.info.run_id / "last.ckpt"
        yield {"directory": directory, "run": run, "last": last, "digest": file_digest(directory / DATA)}


@pytest.fixture
def here(trained, monkeypatch) -> dict:
    """The shared fit's directory as the working directory."""
    monkeypatch.chdir(trained["directory"])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return trained


@contextmanager
def table_as(directory: Path, text: str) -> Iterator[None]:
    """``table.csv`` holding ``text`` (the same path), restored after."""
    path = directory / DATA
    original = path.read_bytes()
    path.write_text(text)
    try:
        yield
    finally:
        path.write_bytes(original)


def refused(capsys, *args: str) -> str:
    """Run ``recipes <args>``: it must exit 2 with one line on stderr, returned."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(list(args))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_the_checkpoint_holds_the_digests_of_the_runs_dataset_inputs(here):
    saved = torch.load(here["last"], map_location="cpu", weights_only=True)[DATA_KEY]
    assert saved["source"] == here["digest"] and len(saved["source"]) == 32
    assert set(saved["splits"]) == {"train", "val", "test"}
    logged = {i.tags[0].value: i.dataset for i in here["run"].inputs.dataset_inputs}
    assert {split: logged[split].digest for split in ("train", "val")} == {
        split: saved["splits"][split] for split in ("train", "val")
    }
    assert all(here["digest"] in logged[split].source for split in ("train", "val"))


REORDERED = HEADER + "".join(ROWS[200:] + ROWS[:200])
APPENDED = HEADER + "".join(ROWS + ROWS[:40])
REPLACED = HEADER + "".join(CHURN[401:801])


@pytest.mark.parametrize("text", [REORDERED, APPENDED, REPLACED], ids=["reordered", "appended", "replaced"])
def test_an_edited_source_under_the_same_path_is_refused_in_one_line(here, capsys, text):
    directory = here["directory"]
    with table_as(directory, text):
        now = file_digest(directory / DATA)
        for stage in ("test", "validate", "predict"):
            err = refused(capsys, stage, "-c", str(TABULAR), "--data.init_args.path", DATA, "--ckpt_path",
                          str(here["last"]))
            assert err.startswith("recipes: error: ")
            assert "the source's content differs from the one this checkpoint was trained on" in err
            assert f"(digest {here['digest'][:8]} vs {now[:8]}: {DATA} edited, replaced or reordered since)" in err
            assert "--allow_data_change true" in err
    assert len(runs_of(directory, EXPERIMENT)) == 1  # nothing ran, no run was made


def test_the_same_bytes_under_another_name_are_accepted(here):
    directory = here["directory"]
    shutil.copyfile(directory / DATA, directory / "copy_of_table.csv")
    main(["test", "-c", str(TABULAR), "--data.init_args.path", "copy_of_table.csv", "--ckpt_path", str(here["last"])])
    run = runs_of(directory, EXPERIMENT)[-1]
    assert run.data.tags["loopwise.stage"] == "test" and "test/acc" in run.data.metrics
    assert "loopwise.allow_data_change" not in run.data.tags and SPLIT_TAG not in run.data.tags


def test_allow_data_change_evaluates_the_edited_file_and_tags_it(here, capsys):
    directory = here["directory"]
    with table_as(directory, REORDERED):
        now = file_digest(directory / DATA)
        main(["test", "-c", str(TABULAR), "--data.init_args.path", DATA, "--ckpt_path", str(here["last"]),
              "--allow_data_change", "true"])
    run = runs_of(directory, EXPERIMENT)[-1]
    assert "test/acc" in run.data.metrics
    assert run.data.tags["loopwise.allow_data_change"] == f"source content: '{here['digest'][:8]}' -> '{now[:8]}'"
    assert SPLIT_TAG not in run.data.tags  # other data was allowed: its splits differ by design, not told twice


def test_a_checkpoint_without_the_digests_keeps_the_path_comparison(here, capsys):
    directory = here["directory"]
    ckpt = torch.load(here["last"], map_location="cpu", weights_only=False)
    del ckpt[DATA_KEY]
    older = directory / "older.ckpt"
    torch.save(ckpt, older)
    shutil.copyfile(directory / DATA, directory / "copy_of_table.csv")
    err = refused(capsys, "test", "-c", str(TABULAR), "--data.init_args.path", "copy_of_table.csv",
                  "--ckpt_path", str(older))
    assert f"path '{DATA}' in the checkpoint, 'copy_of_table.csv' now" in err


def test_last_skips_the_run_whose_source_content_differs(here, capsys):
    directory = here["directory"]
    with table_as(directory, APPENDED):
        now = file_digest(directory / DATA)
        err = refused(capsys, "test", "-c", str(TABULAR), "--data.init_args.path", DATA, "--ckpt_path", "last")
    assert here["run"].info.run_id in err and "source content" in err
    assert here["digest"][:8] in err and now[:8] in err
    # the same bytes under another name: `last` finds the run
    shutil.copyfile(directory / DATA, directory / "copy_of_table.csv")
    main(["test", "-c", str(TABULAR), "--data.init_args.path", "copy_of_table.csv", "--ckpt_path", "last"])
    assert runs_of(directory, EXPERIMENT)[-1].data.tags["loopwise.stage"] == "test"


def test_a_changed_preprocessing_of_the_same_bytes_is_said_and_tagged(here, capsys, monkeypatch):
    from datamodules.tabular import TabularDataModule

    make_dataset = TabularDataModule.make_dataset

    def shifted(self, split, inputs, targets):  # another preprocessing: the same rows, encoded otherwise
        dataset = make_dataset(self, split, inputs, targets)
        dataset.tensors[0].add_(1.0)
        return dataset

    monkeypatch.setattr(TabularDataModule, "make_dataset", shifted)
    capsys.readouterr()
    main(["test", "-c", str(TABULAR), "--data.init_args.path", DATA, "--ckpt_path", str(here["last"])])
    warning = [line for line in capsys.readouterr().err.splitlines() if "split's content differs" in line]
    assert len(warning) == 1 and "preprocessing changed" in warning[0]
    run = runs_of(here["directory"], EXPERIMENT)[-1]
    saved = torch.load(here["last"], map_location="cpu", weights_only=True)[DATA_KEY]["splits"]["test"]
    assert run.data.tags[SPLIT_TAG].startswith(f"test: {saved} -> ")


def test_a_command_reads_the_source_once(here, monkeypatch):
    """The guard, the dataset inputs and the split check share one digest of the file per command."""
    opened = []

    def counting_open(file, *args, **kwargs):
        opened.append(Path(file).name)
        return open(file, *args, **kwargs)

    monkeypatch.setattr(dataset_inputs, "_DIGESTS", {})
    monkeypatch.setattr(dataset_inputs, "open", counting_open, raising=False)
    main(["test", "-c", str(TABULAR), "--data.init_args.path", DATA, "--ckpt_path", "last"])
    assert opened == [DATA]


def test_content_and_settings_are_named_together_and_an_older_checkpoint_compares_the_path(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("a,b\n1,2\n")
    now = {"path": str(table), "seed": 0}
    with pytest.raises(DataSettingsChanged) as refusal:
        guard_data_settings("x.ckpt", "test", {"path": "elsewhere.csv", "seed": 4}, now, False,
                            content={"source": "0" * 32})
    message = str(refusal.value)
    assert message.startswith("--ckpt_path x.ckpt: the source's content differs") and "\n" not in message
    assert f"(digest 00000000 vs {file_digest(table)[:8]}: {table} edited" in message
    assert "and it was trained with other data settings (seed 4 in the checkpoint, 0 now)" in message
    assert "Use the file it was trained on and pass --data.init_args.seed 4 to match it" in message
    # the same bytes: the path is not compared; without the digest (an older checkpoint) it is, as text
    same = {"source": file_digest(table), "splits": {}}
    assert guard_data_settings("x.ckpt", "test", {"path": "elsewhere.csv", "seed": 0}, now, False, content=same) == []
    assert guard_data_settings("x.ckpt", "test", {"path": "elsewhere.csv", "seed": 0}, now, True) == [
        DataChange("path", "elsewhere.csv", str(table))
    ]
    # a generated source (no digest) compares the settings only
    assert guard_data_settings("x.ckpt", "test", {"seed": 4}, {"seed": 4}, False, content={"source": None}) == []
    assert not isinstance(DataChange("path", 1, 2), ContentChange)
