"""The cache of checkpoints fetched from the tracking store: ``<checkpoints_dir>/.fetched/<run id>/<alias>.ckpt``.

``--ckpt_path best|last|run:<id>/...`` takes a run's checkpoint from ``<checkpoints_dir>/<experiment>/<run id>/``
when this directory trained the run, else from the run's artifact ``checkpoints/<alias>.ckpt`` in the store (a
teammate's run, another machine's). The copy lands here, not in ``<experiment>/<run id>/``: that folder belongs to
the directory that trains the run (its journal, lock and upload ledger live there, ``recipes sync`` uploads from it
and a resume writes into it), and a downloaded file in it would pass for the run's own. MLflow keeps no download
cache of its own (``download_artifacts`` without a destination gives a new temporary directory each time).

A cached copy is used again while the store's copy is the same version (``<alias>.version``: the artifact's size,
the step and time its upload was tagged with, the run's end time); otherwise it is fetched again, into a temporary
file renamed over the old one, so a command reading the old copy keeps reading a whole file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR

FETCHED_DIR = ".fetched"
PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@dataclass(frozen=True)
class Fetched:
    """A run's checkpoint as a local file, and whether it came from the store just now (``False``: cached)."""

    path: Path
    downloaded: bool


def fetched_folder(root: str | Path, run_id: str) -> Path:
    """``<root>/.fetched/<run id>``: where a run's fetched checkpoints are kept."""
    return Path(root) / FETCHED_DIR / run_id


def fetch_checkpoint(client: Any, run: Any, alias: str, root: str | Path, reference: str) -> Fetched:
    """The run's ``checkpoints/<alias>.ckpt`` artifact as a local file in the cache (``run``: an MLflow ``Run``).

    Raises ``FileNotFoundError`` (one line, naming ``reference``, the run and what to do) when the run has no such
    artifact or it cannot be downloaded."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    run_id = run.info.run_id
    artifact = f"{CHECKPOINT_ARTIFACT_DIR}/{alias}.ckpt"
    try:
        listed = {a.path: a for a in client.list_artifacts(run_id, CHECKPOINT_ARTIFACT_DIR)}
    except (MlflowException, OSError) as err:
        raise FileNotFoundError(f"--ckpt_path {reference}: cannot list the artifacts of run {run_id}: "
                                f"{str(err).splitlines()[0][:200]}") from None
    if artifact not in listed:
        has = ", ".join(sorted(listed)) or "no checkpoints"
        raise FileNotFoundError(
            f"--ckpt_path {reference}: run {run_id} has no artifact {artifact} in the store ({has}) and no local "
            f"copy; its checkpoints were not uploaded (log_model: false) or were removed: choose another run "
            "(--ckpt_path run:<id>/best) or a checkpoint file"
        )
    tags = run.data.tags
    version = (f"size={listed[artifact].file_size} step={tags.get(f'loopwise.{alias}.step')} "
               f"time={tags.get(f'loopwise.{alias}.time')} end={run.info.end_time}")
    folder = fetched_folder(root, run_id)
    target, stamp = folder / f"{alias}.ckpt", folder / f"{alias}.version"
    if target.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8") == version:
        return Fetched(target.resolve(), downloaded=False)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=folder))
    if rank_zero_only.rank == 0:
        size = listed[artifact].file_size
        print(f"recipes: fetching {artifact} of run {run_id}"
              f"{f' ({size / 1e6:,.1f} MB)' if size else ''} from the store", flush=True)
    bar = os.environ.get(PROGRESS_BAR_ENV)
    os.environ.setdefault(PROGRESS_BAR_ENV, "false")  # MLflow's bar on stderr, unless the user asks for it
    try:
        local = Path(client.download_artifacts(run_id, artifact, str(staging)))
        os.replace(local, target)
        stamp.write_text(version, encoding="utf-8")
    except (MlflowException, OSError) as err:
        raise FileNotFoundError(f"--ckpt_path {reference}: could not fetch {artifact} of run {run_id}: "
                                f"{str(err).splitlines()[0][:200]}") from None
    finally:
        if bar is None:
            os.environ.pop(PROGRESS_BAR_ENV, None)
        shutil.rmtree(staging, ignore_errors=True)
    return Fetched(target.resolve(), downloaded=True)


__all__ = ["FETCHED_DIR", "Fetched", "fetch_checkpoint", "fetched_folder"]
