"""Issue 56, item 1: `recipes fit -c configs/tabular_stream.yaml --data.init_args.path <folder of Parquet files>
--data.init_args.target y` trains on a table it streams a row group at a time: the run records the train split's
rows and the plan's steps before the first step, the model learns (above the majority class), `recipes test
--ckpt_path best` evaluates, and the data guard tells an edited file from the trained one by Parquet metadata."""

from __future__ import annotations

import mlflow
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from datamodules.parquet_source import METADATA_DIGEST, ParquetSource
from datamodules.stream_order import row_hashes, split_codes
from recipes.checkpoints.data_content import DATA_KEY
from recipes.cli import main
from tests.conftest import CONFIGS, mlflow_client, runs_of, working_directory

STREAM = CONFIGS / "tabular_stream.yaml"


def parts(rows: int, seed: int) -> list[pd.DataFrame]:
    """A table in 3 parts: two numbers (one with gaps), a category, a label that depends on them (70% "no")."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=rows), rng.normal(size=rows)
    kind = rng.choice(["p", "q", "r"], rows)
    signal = 1.5 * a - b + (kind == "p") * 1.0 + 0.3 * rng.normal(size=rows)
    label = np.where(signal > np.quantile(signal, 0.7), "yes", "no")
    a[rng.random(rows) < 0.05] = np.nan
    frame = pd.DataFrame({"a": a, "b": b, "kind": kind, "label": label})
    third = rows // 3
    return [frame.iloc[i * third : (i + 1) * third if i < 2 else rows] for i in range(3)]


@pytest.fixture(scope="module")
def fitted(clean_workdir):
    with clean_workdir("streaming_recipe") as directory:
        folder = directory / "events"
        folder.mkdir()
        for i, part in enumerate(parts(3_000, 0)):
            pq.write_table(pa.Table.from_pandas(part, preserve_index=False), folder / f"part-{i}.parquet",
                           row_group_size=200)
        main(["fit", "-c", str(STREAM), "--data.init_args.path", "events", "--data.init_args.target", "label",
              "--trainer.max_epochs", "4"])
    return directory


def test_a_folder_of_parquet_files_trains_with_its_sizes_known_before_the_first_step(fitted):
    (run,) = runs_of(fitted, "tabular_stream")
    assert run.info.status == "FINISHED"
    codes = split_codes(row_hashes(np.arange(3_000), 0), 0.15, 0.15)
    train = int((codes == 0).sum())
    params = run.data.params
    assert params["train_samples"] == str(train) and params["val_samples"] == str(int((codes == 1).sum()))
    batch = int(params["batch_size"])
    assert batch == 128  # auto: the largest power of two <= train rows / 16
    assert params["plan.batches_per_epoch"] == str(train // batch)
    assert params["plan.total_optimizer_steps"] == str(4 * (train // batch))
    history = mlflow_client(fitted).get_metric_history(run.info.run_id, "val/acc")
    assert max(m.value for m in history) > 0.8  # the majority class is 0.7
    # the checkpoint records the source by the digest of its metadata (no read of the rows), as the data guard does
    (best,) = (fitted / "checkpoints" / "tabular_stream" / run.info.run_id).glob("best.ckpt")
    recorded = torch.load(best, weights_only=False)[DATA_KEY]["source"]
    assert recorded == ParquetSource(str(fitted / "events")).fingerprint and recorded.endswith(METADATA_DIGEST)


def test_predict_scores_the_test_split_by_row_number_and_the_logged_model_gives_the_same(fitted):
    """`recipes predict` on a streamed table writes the test split's rows by their numbers in the files, in file
    order; the run's MLflow model (raw rows in, as a user sends them) gives the same probabilities."""
    with working_directory(fitted):
        main(["predict", "-c", str(STREAM), "--data.init_args.path", "events", "--data.init_args.target", "label",
              "--ckpt_path", "best", "--predictions_path", "scores.csv"])
    scores = pd.read_csv(fitted / "scores.csv")
    codes = split_codes(row_hashes(np.arange(3_000), 0), 0.15, 0.15)
    assert list(scores.columns) == ["row", "prediction", "prob_no", "prob_yes"]
    assert scores["row"].tolist() == np.flatnonzero(codes == 2).tolist()
    table = pd.concat(parts(3_000, 0), ignore_index=True)
    raw = table.iloc[scores["row"].to_numpy()[:50]].drop(columns=["label"])
    mlflow.set_tracking_uri(f"sqlite:///{fitted / 'mlflow.db'}")
    (run,) = [r for r in runs_of(fitted, "tabular_stream") if r.data.tags.get("loopwise.stage") == "fit"]
    model = mlflow.pyfunc.load_model(run.data.tags["loopwise.model_uri"])
    served = model.predict(raw.reset_index(drop=True))
    assert served["prob_yes"].to_numpy() == pytest.approx(scores["prob_yes"].to_numpy()[:50], abs=1e-5)


def test_test_evaluates_and_the_data_guard_sees_an_edited_file_by_its_metadata(fitted, capsys):
    with working_directory(fitted):
        # another shuffle window is a loader setting: the same splits, not refused by the data guard
        main(["test", "-c", str(STREAM), "--data.init_args.path", "events", "--data.init_args.target", "label",
              "--ckpt_path", "best", "--data.init_args.window", "4096"])
        edited = pq.read_table(fitted / "events" / "part-1.parquet").to_pandas()
        edited.loc[5, "b"] = 99.0  # one value: its row group's statistics change
        pq.write_table(pa.Table.from_pandas(edited, preserve_index=False), fitted / "events" / "part-1.parquet",
                       row_group_size=200)
        with pytest.raises(SystemExit):
            main(["test", "-c", str(STREAM), "--data.init_args.path", "events", "--data.init_args.target", "label",
                  "--ckpt_path", "best"])
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert "no best.ckpt for experiment 'tabular_stream'" in last and "source content" in last
    assert ":parquet" not in last  # the short digests are hex
    (best,) = (fitted / "checkpoints" / "tabular_stream").glob("*/best.ckpt")
    with working_directory(fitted), pytest.raises(SystemExit):
        main(["test", "-c", str(STREAM), "--data.init_args.path", "events", "--data.init_args.target", "label",
              "--ckpt_path", str(best)])
    assert "the source's content differs from the one this checkpoint was trained on" in capsys.readouterr().err
    assert len([r for r in runs_of(fitted, "tabular_stream") if r.data.tags.get("loopwise.stage") == "test"]) == 1
