"""Short spiral fits that resume each other in one embedded store (shared by tests/checkpoints/test_resume.py and
tests/tracking/test_record_branches.py; their ``shared_store`` and ``store`` fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path

from recipes.cli import main
from tests.conftest import SPIRAL, mlflow_client, runs_of

TINY = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"]


def fit(*extra: str) -> None:
    """`recipes fit` of the spiral recipe on a few batches, in this process."""
    main(["fit", "-c", str(SPIRAL), *TINY, *extra])


def new_runs(directory: Path, before: list) -> list:
    """Runs of spiral_mlp created since ``before`` (a ``runs_of`` list), oldest first, re-read now."""
    seen = {r.info.run_id for r in before}
    return [r for r in runs_of(directory, "spiral_mlp") if r.info.run_id not in seen]


def run_dir(workdir: Path, run_id: str) -> Path:
    """The run's checkpoint folder."""
    return workdir / "checkpoints" / "spiral_mlp" / run_id


def steps(workdir: Path, run_id: str, metric: str) -> list[int]:
    """Metric steps in the order MLflow stored them."""
    history = mlflow_client(workdir).get_metric_history(run_id, metric)
    return [m.step for m in sorted(history, key=lambda m: (m.timestamp, m.step))]
