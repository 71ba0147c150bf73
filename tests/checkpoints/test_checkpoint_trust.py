"""What a ``--ckpt_path`` trusts (issue 53, section 3 and 5): a checkpoint's run stamp is checked against the run asked
for (``run:B/last`` holding run A's file is refused, neither record changes); the store's ``loopwise.best.*`` tags
never outrank what the files say (a tampered tag is one warning, the file wins); a download from the store has a size
limit (``LOOPWISE_MAX_DOWNLOAD_MB``) checked before anything is fetched; a refused pickle never advises loading it.

Two spiral fits in directory A share one store (its artifacts in the store's own folder) with the other directories.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from recipes.cli import main
from tests.conftest import SPIRAL
from tests.team_runs import record_of

EXPERIMENT = "spiral_mlp"
TINY = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"]
GOOD = [*TINY, "--trainer.max_epochs", "2"]
WORSE = [*TINY, "--trainer.max_epochs", "1", "--model.init_args.optimizer.init_args.lr", "1e-6"]
TEST = ["--trainer.limit_test_batches", "2"]


def client_of(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def fit_runs(uri: str) -> list:
    """The experiment's fit runs, oldest first."""
    client = client_of(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    return list(client.search_runs([exp.experiment_id], "tags.`loopwise.stage` = 'fit'",
                                   order_by=["attributes.start_time ASC"]))


def run_recipe(directory: Path, uri: str, monkeypatch, capsys, *args: str, env: dict | None = None
               ) -> tuple[int, str, str]:
    """``recipes <args>`` in ``directory`` on the shared store: (exit code, stdout, stderr)."""
    capsys.readouterr()
    with monkeypatch.context() as patch:
        patch.chdir(directory)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        for key, value in (env or {}).items():
            patch.setenv(key, value)
        try:
            main(list(args))
            code = 0
        except SystemExit as stop:
            code = int(stop.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def best_value(path: Path) -> float:
    ckpt = torch.load(path, weights_only=True, map_location="cpu")
    return next(float(s["best_model_score"]) for k, s in ckpt["callbacks"].items()
                if "'alias': 'best'" in k and s.get("best_model_score") is not None)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A shared store and directory A with a better (2 epochs) and a worse (1 epoch at lr 1e-6) spiral fit."""
    shared = tmp_path_factory.mktemp("trust_store")
    uri = f"sqlite:///{shared / 'mlflow.db'}"
    client_of(uri).create_experiment(EXPERIMENT, artifact_location=str(shared / "artifacts"))
    a = tmp_path_factory.mktemp("trust_dir_a")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(a)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        main(["fit", "-c", str(SPIRAL), *GOOD])
        main(["fit", "-c", str(SPIRAL), *WORSE])
    better, worse = (r.info.run_id for r in fit_runs(uri))
    folder = a / "checkpoints" / EXPERIMENT
    assert best_value(folder / better / "best.ckpt") > best_value(folder / worse / "best.ckpt")  # val/acc, max
    return {"uri": uri, "shared": shared, "a": a, "better": better, "worse": worse, "folder": folder}


# --- 1. a checkpoint stamped by another run ------------------------------------------------------------------------
def test_a_checkpoint_of_run_a_in_run_b_folder_is_refused_and_no_record_changes(two_runs, monkeypatch, capsys):
    uri, a, run_a, run_b = two_runs["uri"], two_runs["a"], two_runs["better"], two_runs["worse"]
    client = client_of(uri)
    b_last = two_runs["folder"] / run_b / "last.ckpt"
    kept = b_last.read_bytes()
    before = {run_id: record_of(client, run_id) for run_id in (run_a, run_b)}
    runs_before = len(client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id]))
    try:
        shutil.copyfile(two_runs["folder"] / run_a / "last.ckpt", b_last)  # A's checkpoint put in B's folder
        code, out, err = run_recipe(a, uri, monkeypatch, capsys, "fit", "-c", str(SPIRAL), *TINY,
                                    "--trainer.max_epochs", "3", "--ckpt_path", f"run:{run_b}/last")
    finally:
        b_last.write_bytes(kept)
    assert code == 2, out[-2000:] + err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"recipes: error: --ckpt_path run:{run_b}/last: "), err
    assert run_a in lines[0] and run_b in lines[0]
    assert f"resuming run {run_a}" not in out
    after = {run_id: record_of(client, run_id) for run_id in (run_a, run_b)}
    assert after == before  # status, end time, tags, params and every metric point of both runs
    assert len(client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])) == runs_before


# --- 2. a tampered best tag -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("tampered, value", [("better", "0.01"), ("worse", "0.999")], ids=["demoted", "promoted"])
def test_a_tampered_best_tag_never_outranks_the_file(two_runs, tmp_path, monkeypatch, capsys, recwarn, tampered,
                                                      value):
    """In a directory that never trained (the runs are ranked by the store's tags), the better run's best tag demoted
    or the worse run's promoted: ``best`` still chooses the better run's file, with one warning naming the run, the
    tag's value and the file's."""
    uri, better = two_runs["uri"], two_runs["better"]
    client = client_of(uri)
    run_id = two_runs[tampered]
    tag = "loopwise.best.value"
    original = client.get_run(run_id).data.tags[tag]
    client.set_tag(run_id, tag, value)
    try:
        code, out, err = run_recipe(tmp_path, uri, monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                    "--ckpt_path", "best")
    finally:
        client.set_tag(run_id, tag, original)
    assert code == 0, err[-3000:]
    fetched = tmp_path / "checkpoints" / ".fetched" / better / "best.ckpt"
    line = next(x for x in out.splitlines() if x.startswith("recipes: --ckpt_path best = "))
    assert line.startswith(f"recipes: --ckpt_path best = {fetched.resolve()} (run {better}, "), line
    # loopwise's warnings print as one `recipes: warning:` line; in-process, pytest records them instead
    warnings = [str(w.message) for w in recwarn if "loopwise.best" in str(w.message)]
    assert len(warnings) == 1, [str(w.message) for w in recwarn]
    file_value = best_value(two_runs["folder"] / run_id / "best.ckpt")
    assert run_id in warnings[0] and tag in warnings[0] and value in warnings[0], warnings
    assert f"{file_value:.4g}" in warnings[0], warnings


# --- section 5: a refused pickle -------------------------------------------------------------------------------------
class Note:
    """An arbitrary object pickled into a checkpoint (not a tensor, not a plain value)."""

    def __init__(self, text: str) -> None:
        self.text = text


TORCH_ADVICE = ("weights_only=False", "weights_only` set to `False`", "likely succeed", "you trust", "safe_globals",
                "allowlist")


@pytest.mark.parametrize("how", ["ckpt_path", "init_from"])
def test_a_refused_pickle_says_what_loopwise_accepts_and_never_advises_loading_it(two_runs, workdir, capsys, how):
    ckpt = torch.load(two_runs["folder"] / two_runs["better"] / "last.ckpt", weights_only=True, map_location="cpu")
    ckpt["notes"] = Note("hello")
    path = workdir / "with_object.ckpt"
    torch.save(ckpt, path)
    script = workdir / "script.pt"  # a TorchScript archive: torch's own refusal of it quotes the same advice
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 3)), script)
    for file in (path, script):
        capsys.readouterr()
        option = (["--ckpt_path", str(file)] if how == "ckpt_path"
                  else ["--model.init_args.init_from", str(file)])
        with pytest.raises(SystemExit) as stop:
            main(["validate" if how == "ckpt_path" else "fit", "-c", str(SPIRAL), *TINY, *option])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("recipes: error: "), err
        assert not any(advice in err for advice in TORCH_ADVICE), err
        if file == path and how == "ckpt_path":
            assert f"needs to unpickle '{Note.__module__}.Note'" in err, err
            assert "loopwise reads" in err and "tensors, plain Python values" in err, err
        elif file == path:
            assert f"{Note.__module__}.Note" in err and "tensors and plain values" in err, err
        else:
            assert "TorchScript" in err, err


# --- a download's size limit -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("reference", ["mlflow:{run}/best", "run:{run}/best", "best"])
def test_a_download_above_the_limit_is_refused_before_anything_is_fetched(two_runs, tmp_path, monkeypatch, capsys,
                                                                           reference):
    """``LOOPWISE_MAX_DOWNLOAD_MB`` below the size of the store's copy: one line with the size, the limit and the
    variable, checked from the store's listing before anything is downloaded."""
    better = two_runs["better"]
    ref = reference.format(run=better)
    (artifact,) = (two_runs["shared"] / "artifacts").glob(f"{better}/artifacts/checkpoints/best.ckpt")
    size = artifact.stat().st_size
    code, out, err = run_recipe(tmp_path, two_runs["uri"], monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                "--ckpt_path", ref, env={"LOOPWISE_MAX_DOWNLOAD_MB": "0.01"})
    assert code == 2, out[-2000:] + err[-2000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"recipes: error: --ckpt_path {ref}: "), err
    assert f"checkpoints/best.ckpt of run {better} is {size / 1e6:,.2f} MB" in lines[0], lines[0]
    assert "above the download limit of 0.01 MB (LOOPWISE_MAX_DOWNLOAD_MB)" in lines[0], lines[0]
    assert list(tmp_path.rglob("*.ckpt")) == []  # nothing was downloaded

    code, out, err = run_recipe(tmp_path, two_runs["uri"], monkeypatch, capsys, "test", "-c", str(SPIRAL), *TEST,
                                "--ckpt_path", ref, env={"LOOPWISE_MAX_DOWNLOAD_MB": "lots"})
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert "LOOPWISE_MAX_DOWNLOAD_MB='lots': expected a number of megabytes" in lines[0], lines[0]
