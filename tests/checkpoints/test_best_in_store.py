"""``--ckpt_path best|last|run:<id>/...`` look in the tracking store, not only in this directory (issue 30, point 4):
two working directories share one store; B never trained, yet finds A's runs, fetches only the chosen checkpoint into
``checkpoints/.fetched/<run id>/``, says whose run it is (user@host), its epoch and value, and tests it to the same
numbers as A; a damaged or missing upload is one line. ``recipes compare`` says who ran each run."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from recipes.cli import main
from tests.conftest import SPIRAL

EXPERIMENT = "spiral_mlp"
GOOD = ["--trainer.max_epochs", "3", "--trainer.limit_val_batches", "2"]
WORSE = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "2",
         "--model.init_args.optimizer.init_args.lr", "1e-6"]
TEST = ["--trainer.limit_test_batches", "2"]


def client_of(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def runs(uri: str, stage: str) -> list:
    """The experiment's runs of ``stage``, oldest first."""
    client = client_of(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    found = client.search_runs([exp.experiment_id], f"tags.`loopwise.stage` = '{stage}'",
                               order_by=["attributes.start_time ASC"])
    return list(found)


def run_recipe(directory: Path, uri: str, monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``recipes <args>`` in ``directory`` on the shared store: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.chdir(directory)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        try:
            main(list(args))
            code = 0
        except SystemExit as stop:
            code = int(stop.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def newest_test_metrics(uri: str) -> dict[str, float]:
    newest = runs(uri, "test")[-1]
    return {k: v for k, v in newest.data.metrics.items() if k.startswith("test/")}


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A shared store (its artifacts in the store's own folder), and dir A with a good and a worse fit of the spiral
    and A's own `test --ckpt_path best` / `last`; A's better run is then re-tagged as alice's on alice-laptop."""
    from mlflow.tracking import MlflowClient

    shared = tmp_path_factory.mktemp("shared_store")
    uri = f"sqlite:///{shared / 'mlflow.db'}"
    MlflowClient(uri).create_experiment(EXPERIMENT, artifact_location=str(shared / "artifacts"))
    a = tmp_path_factory.mktemp("dir_a")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(a)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        main(["fit", "-c", str(SPIRAL), *GOOD])
        main(["fit", "-c", str(SPIRAL), *WORSE])
        better, worse = runs(uri, "fit")
        main(["test", "-c", str(SPIRAL), *TEST, "--ckpt_path", "best"])
        a_best = newest_test_metrics(uri)
        main(["test", "-c", str(SPIRAL), *TEST, "--ckpt_path", "last"])
        a_last = newest_test_metrics(uri)
    client = MlflowClient(uri)
    original = (better.data.tags.get("mlflow.user"), better.data.tags.get("loopwise.host"))
    for run in (better, worse):
        client.set_tag(run.info.run_id, "mlflow.user", "alice")
        client.set_tag(run.info.run_id, "loopwise.host", "alice-laptop")
    return {"uri": uri, "shared": shared, "a": a, "better": better.info.run_id, "worse": worse.info.run_id,
            "a_best": a_best, "a_last": a_last, "original": original}


def file_facts(path: Path, alias: str) -> tuple[int, float | None]:
    """(epoch counted from 1, the monitored value) of a checkpoint file."""
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    value = next((float(s["best_model_score"]) for k, s in ckpt["callbacks"].items()
                  if f"'alias': '{alias}'" in k and s.get("best_model_score") is not None), None)
    return ckpt["epoch"] + 1, value


@pytest.mark.slow  # the module's fixture: two fits and two tests in dir A (about 40 s on 2 busy cores)
def test_a_fit_run_records_who_ran_it_and_its_uploaded_checkpoints(team):
    run = client_of(team["uri"]).get_run(team["better"])
    user, host = team["original"]
    import getpass
    import socket

    assert (user, host) == (getpass.getuser(), socket.gethostname())  # mlflow.user and loopwise.host at creation
    tags = run.data.tags
    own = team["a"] / "checkpoints" / EXPERIMENT / team["better"]
    epoch, value = file_facts(own / "best.ckpt", "best")
    # epochs counted from 1, as the messages show them (issue 53; tags of earlier versions counted from 0)
    assert (int(tags["loopwise.best.epoch"]), float(tags["loopwise.best.value"])) == (epoch, value)
    assert tags["loopwise.best.monitor"] == "val/acc" and tags["loopwise.best.mode"] == "max"
    assert int(tags["loopwise.last.epoch"]) == 3 and "loopwise.last.time" in tags


@pytest.mark.slow
def test_best_and_last_in_a_directory_that_never_trained(team, tmp_path, monkeypatch, capsys):
    b, uri, better = tmp_path, team["uri"], team["better"]
    epoch, value = file_facts(team["a"] / "checkpoints" / EXPERIMENT / better / "best.ckpt", "best")
    fetched = b / "checkpoints" / ".fetched" / better / "best.ckpt"

    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST, "--ckpt_path", "best")
    assert code == 0, err[-2000:]
    line = next(x for x in out.splitlines() if x.startswith("recipes: --ckpt_path best = "))
    assert line == (f"recipes: --ckpt_path best = {fetched.resolve()} (run {better}, epoch {epoch}, val/acc {value:.4g} "
                    "(best of 2 finished fit run(s)), by alice@alice-laptop, fetched from the store)")
    assert newest_test_metrics(uri) == team["a_best"]  # the same numbers as A's own test of its best
    # only the chosen run was fetched, into the cache, never into a run folder of this directory
    assert [p.name for p in (b / "checkpoints" / ".fetched").iterdir()] == [better]
    assert not (b / "checkpoints" / EXPERIMENT).exists()

    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST, "--ckpt_path", "best")
    assert code == 0 and "by alice@alice-laptop, the store's copy, cached)" in out, out + err[-2000:]

    worse = team["worse"]  # `last`: the newest last.ckpt of the store's fit runs
    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST, "--ckpt_path", "last")
    assert code == 0, err[-2000:]
    last = b / "checkpoints" / ".fetched" / worse / "last.ckpt"
    assert (f"recipes: --ckpt_path last = {last.resolve()} (run {worse}, epoch 1, by alice@alice-laptop, fetched "
            "from the store)") in out
    assert newest_test_metrics(uri) == team["a_last"]

    # run:<id>/best is this directory's file or the store's copy; mlflow:<id>/best says what it loaded
    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                "--ckpt_path", f"run:{better}/best")
    assert code == 0 and (f"recipes: --ckpt_path run:{better}/best = {fetched.resolve()} (run {better}, epoch "
                          f"{epoch}, val/acc {value:.4g}, by alice@alice-laptop, the store's copy, cached)") in out, err
    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                "--ckpt_path", f"mlflow:{better}/best")
    assert code == 0, err[-2000:]
    assert re.search(rf"recipes: --ckpt_path mlflow:{better}/best = \S+/best\.ckpt \(run {better}, epoch {epoch}, "
                     rf"val/acc {re.escape(f'{value:.4g}')}, by alice@alice-laptop, downloaded from the store\)", out)
    assert newest_test_metrics(uri) == team["a_best"]

    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "compare", "--format", "json")
    assert code == 0, err
    assert {row["by"] for row in json.loads(out)} == {"alice@alice-laptop"}
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = run_recipe(b, uri, monkeypatch, capsys, "compare")
    header = next(x for x in out.splitlines() if x.startswith("run "))
    assert code == 0 and " by " in header and "alice@alice-laptop" in out, out


@pytest.mark.slow
def test_a_damaged_or_missing_upload_is_one_line(team, tmp_path, monkeypatch, capsys):
    uri, better = team["uri"], team["better"]
    (artifact,) = (team["shared"] / "artifacts").glob(f"{better}/artifacts/checkpoints/best.ckpt")
    kept = artifact.read_bytes()
    try:
        artifact.write_bytes(kept[: len(kept) // 3])  # a truncated upload
        code, out, err = run_recipe(tmp_path, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                    "--ckpt_path", "best")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"recipes: error: --ckpt_path best: by what the store records of its upload the choice "
                              f"is run {better}, epoch ")
        assert "the store's copy (checkpoints/best.ckpt) is damaged: the file is truncated or corrupt" in err
        assert "`recipes sync` in the directory that trained it" in err and "Traceback" not in out + err

        artifact.unlink()  # removed from the store
        shutil.rmtree(tmp_path / "checkpoints" / ".fetched")
        code, out, err = run_recipe(tmp_path, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                    "--ckpt_path", "best")
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert (f"--ckpt_path best: run {better} has no artifact checkpoints/best.ckpt in the store "
                "(checkpoints/last.ckpt) and no local copy") in err
    finally:
        artifact.write_bytes(kept)
