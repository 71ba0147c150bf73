"""The data a run used, as MLflow dataset inputs: the same data gives the same digest anywhere, one byte changes it."""

from __future__ import annotations

import json
import shutil

import pytest

from datamodules import SpiralDataModule, TabularDataModule
from recipes.cli import main
from recipes.tracking.dataset_inputs import split_record, stage_splits
from tests.conftest import REPO, SPIRAL, runs_of

pytestmark = pytest.mark.usefixtures("one_thread")


def churn_records(path) -> dict[str, dict]:
    data = TabularDataModule(path=str(path), target="churn", categorical=["plan", "region", "payment"], seed=0)
    data.setup("fit")
    return {split: split_record(data, split, ds) for split, ds in data.datasets.items()}


def test_the_same_table_gives_the_same_digests_anywhere_and_one_changed_byte_another(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        shutil.copy(REPO / "data" / "churn.csv", tmp_path / folder / "churn.csv")
    a, b = churn_records(tmp_path / "a" / "churn.csv"), churn_records(tmp_path / "b" / "churn.csv")
    assert {s: r["digest"] for s, r in a.items()} == {s: r["digest"] for s, r in b.items()}
    assert a["train"]["source"]["source_digest"] == b["train"]["source"]["source_digest"]
    assert a["train"]["source"]["uri"] != b["train"]["source"]["uri"]
    text = (tmp_path / "b" / "churn.csv").read_text().splitlines()
    header, row = text[0].split(","), text[1].split(",")
    numeric = next(i for i, value in enumerate(row) if value.replace(".", "").isdigit() and header[i] != "churn")
    row[numeric] = str(float(row[numeric]) + 1)  # one value of one row
    (tmp_path / "b" / "churn.csv").write_text("\n".join([text[0], ",".join(row), *text[2:]]) + "\n")
    changed = churn_records(tmp_path / "b" / "churn.csv")
    assert changed["train"]["source"]["source_digest"] != a["train"]["source"]["source_digest"]
    assert sum(changed[s]["digest"] != a[s]["digest"] for s in a) >= 1  # the split holding that row
    assert a["train"]["profile"]["num_rows"] == sum(a["train"]["profile"]["class_counts"])
    assert a["train"]["name"] == "churn.csv/train" and a["train"]["source_type"] == "local"


def test_generated_data_is_named_by_its_class_and_settings_and_digested_by_its_tensors():
    records = []
    for seed in (0, 0, 1):
        data = SpiralDataModule(n_samples=300, seed=seed)
        data.setup("fit")
        records.append(split_record(data, "train", stage_splits(data, "fit")["train"]))
    assert records[0]["digest"] == records[1]["digest"] != records[2]["digest"]
    assert records[0]["source_type"] == "code" and records[0]["source"]["class"] == "datamodules.spiral.SpiralDataModule"
    assert records[0]["source"]["settings"]["n_samples"] == 300 and records[0]["name"] == "SpiralDataModule/train"


def test_fit_and_test_runs_record_their_splits_as_dataset_inputs(workdir):
    short = ["--trainer.max_epochs", "1", "--data.init_args.n_samples", "400"]
    main(["fit", "-c", str(SPIRAL), *short])
    main(["test", "-c", str(SPIRAL), *short, "--ckpt_path", "best"])
    fit, test = runs_of(workdir, "spiral_mlp")
    inputs = {r.info.run_id: {i.tags[0].value: i.dataset for i in r.inputs.dataset_inputs} for r in (fit, test)}
    assert set(inputs[fit.info.run_id]) == {"train", "val"} and set(inputs[test.info.run_id]) == {"test"}
    train = inputs[fit.info.run_id]["train"]
    profile = json.loads(train.profile)
    assert train.name == "SpiralDataModule/train" and profile["num_rows"] == 280 == sum(profile["class_counts"])
    assert json.loads(train.schema)["tensors"][0]["shape"] == [280, 2]


def test_a_dataset_another_run_inserts_at_the_same_moment_is_linked_and_the_store_keeps_working(
        tmp_path, migrated_store, monkeypatch):
    """MLflow's ``log_inputs`` looks the dataset up, then inserts it, not atomically. Two recipes of one experiment on
    the same data, started together, met between the two (1 in 20 runs of ``test_concurrent_runs``): one got
    ``UNIQUE constraint failed: datasets.experiment_id, datasets.name, datasets.digest``, its store was taken as
    failed, and the run stayed RUNNING with no params or metrics. Here the other run's insert lands in that gap."""
    import sqlalchemy.orm
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.store.tracking.dbmodels.models import SqlDataset

    from recipes.tracking.logger import RecipeLogger
    from recipes.tracking.tracked_run import TrackedRun
    from tests.conftest import copy_migrated_store

    uri = f"sqlite:///{copy_migrated_store(migrated_store, tmp_path)}"
    logger = RecipeLogger(experiment_name="e", tracking_uri=uri)
    logger.keep_journal(tmp_path / "checkpoints")
    client, run_id = logger.experiment, logger.run_id
    other = client.create_run(logger.experiment_id).info.run_id
    inputs = [DatasetInput(Dataset("SpiralDataModule/train", "d1g35t", "code", "{}"),
                          [InputTag("mlflow.data.context", "train")])]
    lookup, raced = sqlalchemy.orm.Query.all, []

    def all_rows(query):  # the first lookup of datasets: found nothing, and the other run inserts it right after
        if query.column_descriptions[0]["entity"] is SqlDataset and not raced:
            raced.append(True)
            rows = lookup(query)
            client.log_inputs(other, datasets=inputs)
            return rows
        return lookup(query)

    monkeypatch.setattr(sqlalchemy.orm.Query, "all", all_rows)
    TrackedRun(logger).log_inputs(inputs)
    monkeypatch.undo()
    assert raced and logger.store_failure is None
    (linked,) = client.get_run(run_id).inputs.dataset_inputs
    assert (linked.dataset.name, linked.dataset.digest) == ("SpiralDataModule/train", "d1g35t")
    assert [d.dataset.digest for d in client.get_run(other).inputs.dataset_inputs] == ["d1g35t"]
    logger.log_hyperparams({"lr": 0.01})  # the store still takes the run's writes
    assert client.get_run(run_id).data.params == {"lr": "0.01"}
