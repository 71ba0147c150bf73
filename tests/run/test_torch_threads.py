"""`torch_threads`: a recipe's numbers do not depend on the machine's core count (issue 18, part 7).

CPU kernels split their sums (a convolution's or a Linear layer's weight gradient) across torch's intra-op threads,
so another thread count rounds differently and trains other weights. torch starts one thread per core, so before the
recipes pinned the count a clone on a 1-core or an 8-core machine got other numbers than the README's table.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from recipes.cli import main
from tests.conftest import CONFIGS, REPO, SPIRAL, recipes_env

DIGITS = CONFIGS / "digits_convnet.yaml"


def test_every_recipe_pins_two_threads():
    for recipe in sorted(CONFIGS.glob("*.yaml")):
        assert "\ntorch_threads: 2\n" in recipe.read_text(), recipe.name


class ThreadsSeen(Callback):
    """What the fit runs with: torch's threads and ``OMP_NUM_THREADS`` at the start of training."""

    seen: ClassVar[list[tuple[int, str | None]]] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        ThreadsSeen.seen.append((torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")))


def test_the_run_uses_the_configured_thread_count_and_leaves_the_process_s_own(workdir, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the user's; the run sets its own while it runs
    torch.set_num_threads(3)  # the user's (the autouse one_thread fixture restores the suite's after the test)
    ThreadsSeen.seen = []
    main(["fit", "-c", str(SPIRAL), "--trainer.fast_dev_run", "1", "--torch_threads", "1",
          f"--trainer.callbacks+={__name__}.ThreadsSeen"])
    # Lightning's DDP launchers set cores / processes unless OMP_NUM_THREADS is set: the run's setting is there
    assert ThreadsSeen.seen == [(1, "1")]
    assert torch.get_num_threads() == 3 and os.environ["OMP_NUM_THREADS"] == "7"  # the process's own, after it


def test_a_thread_count_below_one_is_one_line(workdir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(SPIRAL), "--torch_threads", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "torch_threads=0: give a number of threads >= 1, or null for torch's default" in err


def _fit_digits(directory: Path, omp_threads: int, extra: list[str]) -> dict[str, torch.Tensor]:
    """The digits recipe for 2 epochs in a process whose torch was imported with ``OMP_NUM_THREADS=omp_threads`` (a
    machine with that many cores: torch sizes its thread pool at import), forked from a preloaded Python started so."""
    from tests.preloaded_python import preloaded_run

    directory.mkdir()
    (directory / "data").symlink_to(REPO / "data")
    machine = {"OMP_NUM_THREADS": str(omp_threads)}
    command = [sys.executable, "-m", "recipes", "fit", "-c", str(DIGITS), "--trainer.max_epochs", "2",
               "--mlflow_model", "false", "--system_metrics_interval", "0", *extra]
    out = preloaded_run(command, cwd=directory, env={**recipes_env(), **machine}, timeout=600, import_env=machine)
    assert out.returncode == 0, out.stderr[-3000:]
    (last,) = directory.glob("checkpoints/*/*/last.ckpt")
    return torch.load(last, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_the_digits_recipe_trains_the_same_weights_on_machines_with_one_and_two_cores(tmp_path):
    one_core = _fit_digits(tmp_path / "one", 1, [])
    two_cores = _fit_digits(tmp_path / "two", 2, [])
    assert one_core.keys() == two_cores.keys()
    assert all(torch.equal(one_core[k], two_cores[k]) for k in one_core)
    # what the pin removes: left to the machine, the same two epochs train other weights
    unpinned = _fit_digits(tmp_path / "unpinned", 1, ["--torch_threads", "null"])
    assert not all(torch.equal(unpinned[k], two_cores[k]) for k in two_cores)
