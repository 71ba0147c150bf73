"""``recipes.checkpoints.resumed_best`` on small hand-made checkpoint files: which ``best.ckpt`` a resume in another
folder takes, and which it refuses (the whole fits are in ``test_resume_elsewhere.py``)."""

from __future__ import annotations

from pathlib import Path

import torch

from recipes.checkpoints.resumed_best import describe_resume, repointed, restore_best

KEY = "RunCheckpoint{'alias': 'best', 'monitor': 'val/loss', 'mode': 'min'}"


def state(dirpath: Path, score: float | None, **extra: object) -> dict:
    best = str(dirpath / "best.ckpt")
    return {
        "monitor": "val/loss",
        "best_model_score": None if score is None else torch.tensor(score),
        "best_model_path": best if score is not None else "",
        "current_score": None if score is None else torch.tensor(score),
        "dirpath": str(dirpath),
        "best_k_models": {best: torch.tensor(score)} if score is not None else {},
        "kth_best_model_path": best if score is not None else "",
        "kth_value": torch.tensor(score if score is not None else float("inf")),
        "last_model_path": "",
        **extra,
    }


def best_file(path: Path, dirpath: Path, score: float, epoch: int, step: int) -> Path:
    """A ``best.ckpt`` as Lightning writes it, as far as a resume reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": epoch, "global_step": step, "callbacks": {KEY: state(dirpath, score)}}, path)
    return path


def no_store(run_id: str, into: Path) -> Path | None:
    return None


def test_repointed_moves_the_folder_and_every_path_in_it(tmp_path):
    old, new = tmp_path / "a" / "run", tmp_path / "b" / "run"
    moved = repointed(state(old, 0.5), str(new))
    assert moved["dirpath"] == str(new)
    assert moved["best_model_path"] == moved["kth_best_model_path"] == str(new / "best.ckpt")
    assert list(moved["best_k_models"]) == [str(new / "best.ckpt")]
    assert float(moved["best_model_score"]) == 0.5


def test_the_old_folders_file_with_the_states_value_is_copied(tmp_path):
    old, new = tmp_path / "a" / "run", tmp_path / "b" / "run"
    best_file(old / "best.ckpt", old, 0.5119, epoch=2, step=30)
    kept = restore_best(state(old, 0.5119), str(new), KEY, 150, no_store)
    assert kept.file is not None and (kept.file.epoch, kept.file.step) == (2, 30)
    assert kept.origin == f"copied from {old / 'best.ckpt'}"
    assert torch.load(new / "best.ckpt", weights_only=True)["global_step"] == 30
    assert (kept.state["best_epoch"], kept.state["best_step"]) == (2, 30)
    assert (old / "best.ckpt").is_file()  # copied, the old folder's file is left alone
    assert sorted(p.name for p in new.iterdir()) == ["best.ckpt"]  # no scratch folder left


def test_an_older_best_from_the_store_is_taken_with_its_own_state(tmp_path):
    """The store missed the last upload of best.ckpt: its copy holds an earlier, worse best."""
    old, new = tmp_path / "a" / "run", tmp_path / "b" / "run"
    stored = best_file(tmp_path / "store" / "best.ckpt", old, 0.60, epoch=0, step=10)

    def fetch(run_id: str, into: Path) -> Path:
        assert run_id == "run"  # the run's folder is named by its id
        return Path(stored)

    kept = restore_best(state(old, 0.5119), str(new), KEY, 150, fetch)
    assert kept.file is not None and kept.file.epoch == 0 and kept.file.score == torch.tensor(0.60).item()
    assert float(kept.state["best_model_score"]) == torch.tensor(0.60).item()  # the file's own state
    assert kept.state["dirpath"] == str(new) and kept.state["best_model_path"] == str(new / "best.ckpt")
    assert "fetched from the store" in kept.origin and "0.5119" in kept.origin
    assert torch.load(new / "best.ckpt", weights_only=True)["global_step"] == 10


def test_a_best_from_after_the_resumed_step_is_never_taken(tmp_path):
    """A branch from an older checkpoint: the old run's best.ckpt went on to a later epoch."""
    old, new = tmp_path / "a" / "run", tmp_path / "b" / "run2"
    best_file(old / "best.ckpt", old, 0.40, epoch=9, step=100)
    kept = restore_best(state(old, 0.5119), str(new), KEY, 50, no_store)
    assert kept.file is None and kept.state["best_model_score"] is None and kept.state["best_k_models"] == {}
    assert "restarts from this resume" in kept.origin
    assert not (new / "best.ckpt").exists()
    line = describe_resume("run2", 4, 50, "copy/last.ckpt", "val/loss", kept)
    assert line.startswith("recipes: resuming run run2 from epoch 5, step 50 (copy/last.ckpt); best so far: none (")


def test_another_best_ckpt_already_in_the_folder_is_kept_aside(tmp_path):
    old, new = tmp_path / "a" / "run", tmp_path / "b" / "run"
    best_file(old / "best.ckpt", old, 0.5119, epoch=2, step=30)
    best_file(new / "best.ckpt", new, 0.70, epoch=5, step=60)
    kept = restore_best(state(old, 0.5119), str(new), KEY, 150, no_store)
    (aside,) = new.glob("best.replaced-*.ckpt")
    assert torch.load(aside, weights_only=True)["global_step"] == 60
    assert torch.load(new / "best.ckpt", weights_only=True)["global_step"] == 30
    assert f"kept as {aside.name}" in kept.origin


def test_in_its_own_folder_the_best_is_named_from_the_state_without_reading_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.ckpt").write_bytes(b"not read")
    kept = restore_best(state(run, 0.5119, best_epoch=2, best_step=30), str(run), KEY, 150, no_store)
    assert kept.file is not None and (kept.file.epoch, kept.file.step) == (2, 30) and kept.origin == ""
    assert describe_resume("run", 9, 150, "last", "val/loss", kept) == (
        "recipes: resuming run run from epoch 10, step 150 (last); best so far: epoch 3, val/loss 0.5119 "
        "(run/best.ckpt)"
    )


def test_a_resumed_best_ckpt_is_its_own_best_when_the_run_went_on(tmp_path):
    """`--ckpt_path` of a best.ckpt (a branch): the old run's best.ckpt has moved on; the resumed file is the best."""
    old, new = tmp_path / "a" / "run", tmp_path / "a" / "branch"
    best_file(old / "best.ckpt", old, 0.40, epoch=9, step=100)  # the old run's newer best
    resumed = tmp_path / "copy" / "best.ckpt"
    resumed.parent.mkdir()
    torch.save({"epoch": 2, "global_step": 30, "callbacks": {KEY: state(old, 0.5119, best_epoch=2, best_step=30)}},
               resumed)
    kept = restore_best(state(old, 0.5119, best_epoch=2, best_step=30), str(new), KEY, 30, no_store, str(resumed))
    assert kept.file is not None and (kept.file.epoch, kept.file.step) == (2, 30)
    assert kept.origin == f"copied from {resumed}"
    assert torch.load(new / "best.ckpt", weights_only=True)["global_step"] == 30
