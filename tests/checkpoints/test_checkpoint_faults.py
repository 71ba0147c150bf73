"""Faults around checkpoints: atomic writes, a NaN batch, and files that are not (our) checkpoints."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from recipes.checkpoints.atomic_io import AtomicCheckpointIO
from recipes.cli import main
from tests.conftest import CONFIGS, REPO, SPIRAL, runs_of

TINY = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"]


def last_checkpoints(directory: Path, experiment: str = "spiral_mlp") -> list[Path]:
    return sorted((directory / "checkpoints" / experiment).glob("*/last.ckpt"))


def partial_then_fail(real_save, fail_when):
    """A torch.save that, when ``fail_when(obj)``, writes half of the real bytes to the target and raises (a crash
    or a full disk in the middle of a write)."""

    def save(obj, f, *args, **kwargs):
        if not fail_when(obj):
            return real_save(obj, f, *args, **kwargs)
        import io

        buffer = io.BytesIO()
        real_save(obj, buffer)
        data = buffer.getvalue()[: len(buffer.getvalue()) // 2]
        if hasattr(f, "write"):
            f.write(data)
            f.flush()
        else:
            Path(f).write_bytes(data)
        raise OSError(28, "No space left on device (simulated)")

    return save


# --- atomic writes -------------------------------------------------------------------------------------------------
def test_atomic_checkpoint_io_crash_mid_write_keeps_the_previous_file(tmp_path, monkeypatch):
    io_plugin = AtomicCheckpointIO()
    target = tmp_path / "run" / "last.ckpt"
    io_plugin.save_checkpoint({"state_dict": {"w": torch.ones(1000)}, "global_step": 1}, target)
    before = target.read_bytes()
    with monkeypatch.context() as patch, pytest.raises(OSError, match="No space left"):
        patch.setattr(torch, "save", partial_then_fail(torch.save, lambda obj: True))
        io_plugin.save_checkpoint({"state_dict": {"w": torch.zeros(1000)}, "global_step": 2}, target)
    assert target.read_bytes() == before  # untouched, not truncated
    assert torch.load(target, weights_only=True)["global_step"] == 1
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # no temp file left behind
    # a successful save replaces it completely, with an ordinary file mode
    io_plugin.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 3}, target)
    assert torch.load(target, weights_only=True)["global_step"] == 3
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]
    assert target.stat().st_mode & 0o644 == 0o644


def test_lightning_torch_checkpoint_io_stages_outside_the_checkpoint_directory(tmp_path, monkeypatch):
    """Why AtomicCheckpointIO exists: Lightning 2.6 stages the write in the system temp directory (then a
    cross-device ``shutil.move`` copies it into place, which a crash can cut short), never next to the target."""
    import tempfile

    from lightning.pytorch.plugins.io import TorchCheckpointIO

    staged: list[str] = []
    real_mkstemp = tempfile.mkstemp

    def spy(*args, **kwargs):
        fd, name = real_mkstemp(*args, **kwargs)
        staged.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    TorchCheckpointIO().save_checkpoint({"a": torch.ones(2)}, tmp_path / "ckpt" / "last.ckpt")
    AtomicCheckpointIO().save_checkpoint({"a": torch.ones(2)}, tmp_path / "ours" / "last.ckpt")
    assert len(staged) == 2
    assert Path(staged[0]).parent != tmp_path / "ckpt"  # Lightning: the system temp dir
    assert Path(staged[1]).parent == tmp_path / "ours"  # ours: the checkpoint's own directory


@pytest.mark.slow
def test_a_crash_while_saving_in_a_recipe_keeps_the_previous_last_ckpt(workdir, monkeypatch, capsys):
    # epoch 0 saves best.ckpt and last.ckpt; the first save of epoch 1 dies half-way through the write
    dies_in_epoch_1 = partial_then_fail(torch.save, lambda obj: isinstance(obj, dict) and obj.get("epoch") == 1)
    with monkeypatch.context() as patch, pytest.raises(SystemExit) as exit_:
        patch.setattr(torch, "save", dies_in_epoch_1)
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "3"])
    line = capsys.readouterr().err.strip().splitlines()[-1]  # one line, no traceback (issue 28)
    assert exit_.value.code == 1 and line.startswith("recipes: error: the disk is full at ")
    assert "(No space left on device) while writing " in line and "is kept intact" in line
    (last,) = last_checkpoints(workdir)
    ckpt = torch.load(last, weights_only=True)
    assert (ckpt["epoch"], ckpt["global_step"]) == (0, 3)
    files = ["best.ckpt", "checkpoint-uploads.json", "last.ckpt", "tracking-journal.jsonl"]
    assert sorted(p.name for p in last.parent.iterdir()) == files  # no temp file left behind
    assert [r.info.status for r in runs_of(workdir, "spiral_mlp")] == ["FAILED"]
    # and the run resumes from it
    main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert torch.load(last, weights_only=True)["global_step"] == 6


# --- a NaN batch ---------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_nan_batch_stops_with_the_step_and_leaves_the_last_good_checkpoint(workdir, monkeypatch):
    from lightning_modules import ClassificationModule
    from recipes.callbacks import NonFiniteError

    original = ClassificationModule.on_after_batch_transfer

    def poisoned(self, batch, dataloader_idx):
        batch = original(self, batch, dataloader_idx)
        if self.trainer.training and self.global_step == 7:  # epoch 2, batch 1 (3 batches per epoch)
            x, y = batch
            x = x.clone()
            x[5, 0] = float("nan")  # as if row 5 of this batch held a NaN in the data
            batch = (x, y)
        return batch

    monkeypatch.setattr(ClassificationModule, "on_after_batch_transfer", poisoned)
    with pytest.raises(NonFiniteError) as error:
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "5"])
    message = str(error.value)
    assert message.startswith("non-finite loss (nan) at global step 7 (epoch 2, batch 1)")
    assert "row(s) 5 of the batch" in message
    (last,) = last_checkpoints(workdir)
    ckpt = torch.load(last, weights_only=True)
    assert (ckpt["epoch"], ckpt["global_step"]) == (1, 6)  # the end of the last good epoch, before the NaN
    assert all(bool(torch.isfinite(v).all()) for v in ckpt["state_dict"].values() if v.is_floating_point())
    for state in ckpt["optimizer_states"][0]["state"].values():
        assert all(bool(torch.isfinite(v).all()) for v in state.values() if torch.is_tensor(v))
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.info.status == "FAILED"
    assert run.data.tags["doctor.non_finite"].startswith("non-finite loss (nan) at global step 7")


# --- files that are not our checkpoints ----------------------------------------------------------------------------
class CodeOnLoad:
    """An object whose unpickling calls a function: here it would create a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.fixture(scope="module")
def spiral_checkpoint(clean_workdir) -> Path:
    """A real last.ckpt of a tiny spiral fit (no logger: no store)."""
    with clean_workdir("spiral_ckpt", store=False) as directory:
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "1", "--trainer.logger", "false"])
    (path,) = directory.glob("checkpoints/spiral_mlp/*/last.ckpt")
    return path


def bad_checkpoint(kind: str, source: Path, directory: Path) -> Path:
    path = directory / f"{kind}.ckpt"
    if kind == "truncated":
        data = source.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "text":
        path.write_text("epoch: 3\nthis is not a checkpoint\n")
    elif kind == "tensor":
        torch.save(torch.zeros(3, 3), path)
    elif kind == "state_dict_only":
        torch.save(torch.load(source, weights_only=True)["state_dict"], path)
    elif kind == "weights_only":
        ckpt = torch.load(source, weights_only=True)
        torch.save({k: ckpt[k] for k in ("state_dict", "hyper_parameters", "pytorch-lightning_version")}, path)
    elif kind == "unsafe_pickle":
        ckpt = torch.load(source, weights_only=True)
        ckpt["hyper_parameters"]["payload"] = CodeOnLoad(directory / "code_ran")
        torch.save(ckpt, path)
    else:
        raise ValueError(kind)
    return path


BAD_CHECKPOINTS = [
    ("truncated", "fit", "the file is truncated or corrupt"),
    ("empty", "fit", "the file is empty (0 bytes)"),
    ("text", "fit", "not a PyTorch checkpoint file"),
    ("tensor", "validate", "not a Lightning checkpoint: the file holds a Tensor"),
    ("state_dict_only", "validate", "not a Lightning checkpoint: no 'state_dict'"),
    ("weights_only", "fit", "cannot resume training from it: it has no loops, optimizer_states"),
    ("unsafe_pickle", "fit", "refused to load: the file needs to unpickle 'posix.mkdir'"),
    ("unsafe_pickle", "validate", "refused to load"),
]


@pytest.mark.parametrize("kind, subcommand, message", BAD_CHECKPOINTS, ids=[f"{k}-{s}" for k, s, _ in BAD_CHECKPOINTS])
@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_a_bad_checkpoint_file_is_a_clear_error_before_training(
    workdir, capsys, spiral_checkpoint, kind, subcommand, message
):
    path = bad_checkpoint(kind, spiral_checkpoint, workdir)
    with pytest.raises(SystemExit) as exc:
        main([subcommand, "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2", "--ckpt_path", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"recipes: error: --ckpt_path {path.resolve()}: {message}" in err
    assert not (workdir / "code_ran").exists()  # the pickle's code never ran
    assert not (workdir / "mlflow.db").exists() and not (workdir / "checkpoints").exists()  # nothing was started


@pytest.mark.parametrize("subcommand", ["fit", "validate"])
def test_weights_for_another_network_are_a_clear_error_before_training(workdir, capsys, spiral_checkpoint, subcommand):
    # a checkpoint without the recipe's model config (as a module built in Python writes it): the config's network is
    # built, a 2-32-3 MLP, and the checkpoint's 2-128-128-3 weights do not fit it
    ckpt = torch.load(spiral_checkpoint, weights_only=True)
    del ckpt["hyper_parameters"], ckpt["hparams_name"]
    path = workdir / "python_built.ckpt"
    torch.save(ckpt, path)
    args = ["--model.init_args.model.init_args.hidden_sizes", "[32]", "--ckpt_path", str(path)]
    with pytest.raises(SystemExit) as exc:
        main([subcommand, "-c", str(SPIRAL), *TINY, *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"recipes: error: CheckpointError: --ckpt_path {path}: its weights do not fit this recipe's " in err, err
    assert "ClassificationModule: 2 unexpected key(s) (model.net.4.weight, model.net.4.bias)" in err
    assert "model.net.0.weight: checkpoint (128, 2) vs model (32, 2)" in err
    assert runs_of(workdir, "spiral_mlp") == [], [r.info for r in runs_of(workdir, "spiral_mlp")]


@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_a_checkpoint_of_another_recipe_is_refused(workdir, capsys, spiral_checkpoint):
    if (REPO / "data").is_dir():
        (workdir / "data").symlink_to(REPO / "data")
    with pytest.raises(SystemExit) as exc:
        main(["validate", "-c", str(CONFIGS / "tabular_mlp.yaml"), "--ckpt_path", str(spiral_checkpoint)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"recipes: error: --ckpt_path {spiral_checkpoint}: it was trained on SpiralDataModule, but this recipe's data "
        "is TabularDataModule: a checkpoint of another recipe?"
    ) in err, err
    assert not (workdir / "mlflow.db").exists()
