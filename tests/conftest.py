"""Shared fixtures: every test runs in its own working directory with the embedded MLflow default."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# nothing in the tests reaches the Hugging Face hub: a tokenizer or model name that is not a local directory is looked
# up in the local cache only (read when huggingface_hub is imported, so set before any test module imports it)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
SPIRAL = CONFIGS / "spiral_mlp.yaml"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory with no MLFLOW_TRACKING_URI: runs land in ./mlflow.db, ./mlruns, ./checkpoints."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


@pytest.fixture
def one_thread():
    """Tiny models run faster on one torch thread, above all on a busy 2-core machine (``usefixtures("one_thread")``)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def mlflow_client(directory: Path):
    """An MLflow client on the embedded store of ``directory``."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{Path(directory).resolve() / 'mlflow.db'}")


def runs_of(directory: Path, experiment: str) -> list:
    """All runs of ``experiment`` in the embedded store of ``directory``, oldest first."""
    client = mlflow_client(directory)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    runs = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])
    return list(runs)


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONWARNINGS", os.environ.get("PYTHONWARNINGS", "ignore::DeprecationWarning"))
