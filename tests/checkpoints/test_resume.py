"""Resuming a fit continues its MLflow run; SIGTERM/SIGINT end it KILLED; ``--ckpt_path mlflow:<run>/best``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from recipes.checkpoints.files import read_run_stamp
from recipes.cli import main
from tests.conftest import SPIRAL, mlflow_client, runs_of
from tests.resume_runs import TINY, fit, new_runs, run_dir, steps
from tests.preloaded_python import preloaded_popen

def test_checkpoints_carry_the_run_id_and_fit_resume_continues_that_run(store):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (first,) = new_runs(store, before)
    run_id = first.info.run_id
    last = run_dir(store, run_id) / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["loopwise"] == {"mlflow_run_id": run_id, "experiment": "spiral_mlp", "step": "3"}
    assert read_run_stamp(run_dir(store, run_id) / "best.ckpt")["mlflow_run_id"] == run_id

    fit("--trainer.max_epochs", "2", "--ckpt_path", "last")  # the newest last.ckpt: this test's
    (run,) = new_runs(store, before)  # no second run
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    # params keep the first start's values; the changed ones are tags
    assert run.data.params["max_epochs"] == "1" and run.data.params == first.data.params
    assert run.data.tags["loopwise.resumed.max_epochs"] == "2"
    assert run.data.tags["loopwise.resumed.plan.total_optimizer_steps"] == "6"
    assert run.data.tags["loopwise.resumed_at_step"] == "3"
    assert run.data.tags["loopwise.ckpt_path"] == str(last.resolve())
    assert steps(store, run_id, "val/acc") == [2, 5]  # monotonic, continuing at the restored global step
    assert sorted(p.name for p in run_dir(store, run_id).iterdir()) == [
        "best.ckpt", "checkpoint-uploads.json", "last.ckpt", "tracking-journal.jsonl"]  # fmt: skip
    assert torch.load(last, weights_only=True)["global_step"] == 6


def test_resume_with_the_same_config_logs_nothing_new(store):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (first,) = new_runs(store, before)
    last = run_dir(store, first.info.run_id) / "last.ckpt"
    fit("--trainer.max_epochs", "1", "--ckpt_path", str(last))  # already done: nothing to train, nothing raised
    (run,) = new_runs(store, before)
    assert run.info.run_id == first.info.run_id and run.info.status == "FINISHED"
    assert run.data.params == first.data.params
    assert not [k for k in run.data.tags if k.startswith("loopwise.resumed.")]


def test_evaluation_with_a_checkpoint_makes_its_own_run(store):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (fit_run,) = new_runs(store, before)
    last = run_dir(store, fit_run.info.run_id) / "last.ckpt"
    main(["validate", "-c", str(SPIRAL), *TINY, "--ckpt_path", str(last)])
    runs = new_runs(store, before)
    assert len(runs) == 2 and runs[1].info.run_id != fit_run.info.run_id
    assert runs[1].data.tags["loopwise.stage"] == "validate"
    assert all(r.info.status == "FINISHED" for r in runs)


def test_an_exception_during_training_marks_the_run_failed(store, monkeypatch):
    from lightning_modules import ClassificationModule

    original = ClassificationModule.training_step

    def boom(self, batch, batch_idx):
        if self.global_step == 2:
            raise RuntimeError("boom")
        return original(self, batch, batch_idx)

    monkeypatch.setattr(ClassificationModule, "training_step", boom)
    before = runs_of(store, "spiral_mlp")
    with pytest.raises(RuntimeError, match="boom"):
        fit("--trainer.max_epochs", "1")
    (run,) = new_runs(store, before)
    assert run.info.status == "FAILED"


def test_fit_from_a_checkpoint_of_an_unknown_run_starts_a_new_run(store, tmp_path, monkeypatch):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (old,) = new_runs(store, before)
    ckpt = run_dir(store, old.info.run_id) / "last.ckpt"
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.warns(UserWarning, match="which is not in"):
        fit("--trainer.max_epochs", "2", "--ckpt_path", str(ckpt))
    (run,) = runs_of(tmp_path, "spiral_mlp")
    assert run.info.run_id != old.info.run_id and run.info.status == "FINISHED"


def test_ckpt_path_mlflow_run_best_downloads_the_artifact(store, capsys):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (fit_run,) = new_runs(store, before)
    run_id = fit_run.info.run_id
    own = run_dir(store, run_id) / "best.ckpt"
    content = own.read_bytes()
    main(["validate", "-c", str(SPIRAL), *TINY, "--ckpt_path", f"mlflow:{run_id}/best"])
    validate_run = new_runs(store, before)[-1]
    used = Path(validate_run.data.tags["loopwise.ckpt_path"])
    assert used.is_file() and used.name == "best.ckpt"
    assert run_dir(store, run_id) / "downloaded" in used.parents
    assert own.read_bytes() == content  # the run's own checkpoint is untouched
    assert used.read_bytes() == content  # log_model uploaded it unchanged
    # a second download goes to a new directory
    main(["test", "-c", str(SPIRAL), *TINY, "--ckpt_path", f"mlflow:{run_id}/last"])
    assert len(list((run_dir(store, run_id) / "downloaded").iterdir())) == 2

    with pytest.raises(SystemExit) as exc:
        main(["validate", "-c", str(SPIRAL), "--ckpt_path", "mlflow:0123456789abcdef/best"])
    assert exc.value.code != 0
    assert "no MLflow run '0123456789abcdef'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate", "-c", str(SPIRAL), "--ckpt_path", f"mlflow:{validate_run.info.run_id}/best"])
    assert "has no artifact checkpoints/best.ckpt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["validate", "-c", str(SPIRAL), "--ckpt_path", f"mlflow:{run_id}/worst"])
    assert "expected mlflow:<run id>/best" in capsys.readouterr().err


def test_fit_from_mlflow_last_continues_the_run(store):
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (first,) = new_runs(store, before)
    fit("--trainer.max_epochs", "2", "--ckpt_path", f"mlflow:{first.info.run_id}/last")
    runs = new_runs(store, before)
    assert [r.info.run_id for r in runs] == [first.info.run_id] and runs[0].info.status == "FINISHED"
    assert steps(store, first.info.run_id, "val/acc") == [2, 5]


# --- signals: a real `python -m recipes fit` process -------------------------------------------------------------
def start_long_fit(workdir: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    return preloaded_popen(
        [sys.executable, "-m", "recipes", "fit", "-c", str(SPIRAL), "--trainer.max_epochs", "200"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_last_checkpoint(workdir: Path, proc: subprocess.Popen, timeout: float = 60.0) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list((workdir / "checkpoints" / "spiral_mlp").glob("*/last.ckpt"))
        if found:
            time.sleep(0.5)  # well inside the next epoch
            return found[0]
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    proc.kill()
    out, _ = proc.communicate()
    pytest.fail(f"no last.ckpt within {timeout} s; output:\n{out[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_last_marks_killed_and_resume_finishes_the_run(workdir, signum):
    proc = start_long_fit(workdir)
    wait_for_last_checkpoint(workdir, proc)
    proc.send_signal(signum)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, out[-3000:]
    assert f"{signum.name} received: saved" in out
    if signum == signal.SIGINT:
        assert "stopping after this batch" in out  # routed into Lightning's SIGTERM path
    (run,) = runs_of(workdir, "spiral_mlp")
    run_id = run.info.run_id
    assert run.info.status == "KILLED"
    last = run_dir(workdir, run_id) / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    assert ckpt["loopwise"]["mlflow_run_id"] == run_id
    assert ckpt["global_step"] > 0
    artifacts = {a.path for a in mlflow_client(workdir).list_artifacts(run_id, "checkpoints")}
    assert "checkpoints/last.ckpt" in artifacts
    before = steps(workdir, run_id, "train/loss")

    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", str(ckpt["epoch"] + 1), "--ckpt_path", "last"])
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.info.run_id == run_id and run.info.status == "FINISHED"
    after = steps(workdir, run_id, "train/loss")
    assert after[: len(before)] == before and after == sorted(after) and len(after) >= len(before)
    assert torch.load(last, weights_only=True)["global_step"] >= ckpt["global_step"]


@pytest.mark.slow
def test_resume_after_sigkill_finishes_the_run(workdir):
    proc = start_long_fit(workdir)
    wait_for_last_checkpoint(workdir, proc)
    proc.kill()
    proc.communicate(timeout=60)
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.info.status == "RUNNING"  # nobody could tell MLflow
    last = run_dir(workdir, run.info.run_id) / "last.ckpt"
    ckpt = torch.load(last, weights_only=True)
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", str(ckpt["epoch"] + 2), "--ckpt_path", "last"])
    (resumed,) = runs_of(workdir, "spiral_mlp")
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    assert torch.load(last, weights_only=True)["global_step"] > ckpt["global_step"]


def test_a_resume_reads_the_checkpoint_once_before_lightning_restores_it(store, monkeypatch):
    """loopwise's own checks read a --ckpt_path file once (weights only); Lightning then reads it to restore state."""
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (first,) = new_runs(store, before)
    last = run_dir(store, first.info.run_id) / "last.ckpt"
    readers: list[str] = []
    original = torch.load

    def counting_load(*args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("torch"):
            frame = frame.f_back
        readers.append(frame.f_globals.get("__name__", "?") if frame is not None else "?")
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    fit("--trainer.max_epochs", "2", "--ckpt_path", str(last))
    ours = [name for name in readers if name.split(".")[0] in ("recipes", "lightning_modules", "datamodules")]
    assert ours == ["recipes.checkpoints.files"], readers
    assert any(name.startswith("lightning") for name in readers), readers


def test_resolving_last_reads_each_candidate_once_and_the_chosen_one_not_again(store, monkeypatch):
    """`--ckpt_path last` reads the candidates to choose; the checks then reuse the chosen file's content."""
    before = runs_of(store, "spiral_mlp")
    fit("--trainer.max_epochs", "1")
    (first,) = new_runs(store, before)
    last = (run_dir(store, first.info.run_id) / "last.ckpt").resolve()
    ours: list[str] = []
    original = torch.load

    def counting_load(f, *args, **kwargs):
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("torch"):
            frame = frame.f_back
        if frame is not None and frame.f_globals.get("__name__", "").startswith("recipes"):
            ours.append(str(Path(f).resolve()))
        return original(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    fit("--trainer.max_epochs", "2", "--ckpt_path", "last")  # the newest last.ckpt: this test's
    assert ours.count(str(last)) == 1, ours
    assert len(ours) == len(set(ours))  # no file is read twice by loopwise
