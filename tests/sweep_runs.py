"""A short `recipes sweep` of the spiral recipe in-process and its Optuna study (shared by the tests in tests/sweep)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from recipes.cli import main
from tests.conftest import CONFIGS, SPIRAL

SWEEP = CONFIGS / "sweeps" / "spiral_mlp.yaml"
SHORT = ["--trainer.max_epochs", "3", "--data.init_args.n_samples", "600"]


def sweep(*extra: str, sweep_file: Path = SWEEP) -> int:
    """`recipes sweep -c spiral_mlp.yaml -c <sweep_file> <SHORT> <extra>` in this process; its exit code."""
    with pytest.raises(SystemExit) as exc:
        main(["sweep", "-c", str(SPIRAL), "-c", str(sweep_file), *SHORT, *extra])
    return exc.value.code


def study_of(workdir: Path, name: str = "spiral_mlp-sweep") -> optuna.Study:
    """The Optuna study ``name`` in ``workdir/optuna.db``."""
    return optuna.load_study(study_name=name, storage=f"sqlite:///{workdir / 'optuna.db'}")
