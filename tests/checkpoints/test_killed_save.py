"""A ``kill -9`` in the middle of a checkpoint save (issue 53, section 2): the previous checkpoint stays whole, the
temp file the kill leaves is hidden (never a ``.ckpt``), and the next start in that folder removes it."""

from __future__ import annotations

import os
import signal
import sys

import torch
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from tests.conftest import SPIRAL, recipes_env, runs_of
from tests.preloaded_python import preloaded_run
from tests.resume_runs import TINY, run_dir

FIT = ["fit", "-c", str(SPIRAL), *TINY, "--mlflow_model", "false"]


class KilledWhileSavingSecondEpoch(Callback):
    """``kill -9`` of this process once the checkpoint of the second epoch has its first bytes on disk."""

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        if trainer.current_epoch != 1:
            return

        def first_bytes_then_killed(obj, handle, *args, **kwargs):
            handle.write(b"PK\x03\x04 the first bytes of a zip archive")
            handle.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = first_bytes_then_killed  # the save that follows this hook, in this (doomed) process only


def test_a_save_killed_9_leaves_a_hidden_temp_file_that_the_next_start_removes(workdir):
    killed = preloaded_run([sys.executable, "-m", "recipes", *FIT, "--trainer.max_epochs", "3",
                            "--trainer.callbacks+=tests.checkpoints.test_killed_save.KilledWhileSavingSecondEpoch"],
                           cwd=workdir, env=recipes_env(), timeout=300)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    (run,) = runs_of(workdir, "spiral_mlp")
    folder = run_dir(workdir, run.info.run_id)
    (leftover,) = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert leftover.name.startswith(".") and ".ckpt." in leftover.name  # hidden, not a .ckpt
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 0  # the previous checkpoint, whole
    main([*FIT, "--trainer.max_epochs", "3", "--ckpt_path", "last"])
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 2
    assert runs_of(workdir, "spiral_mlp")[0].info.status == "FINISHED"
