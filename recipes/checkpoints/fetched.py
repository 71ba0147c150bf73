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

Every download of a checkpoint from the store (this cache, ``mlflow:<id>/...``, a resumed run's ``best.ckpt``) goes
through ``download_checked``: its size, read from the store's listing (``MlflowClient.list_artifacts``'s
``file_size``) before anything is fetched, must be at most ``LOOPWISE_MAX_DOWNLOAD_MB`` megabytes (10^6 bytes;
default ``DEFAULT_MAX_DOWNLOAD_MB``) and fit the free space of the target's disk, else one line says so and nothing
is downloaded. A download above ``PROGRESS_ABOVE_MB`` says when it starts and ends, with MLflow's own progress bar
between (unless ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR`` is set).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.checkpoints.files import CheckpointError
from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR

FETCHED_DIR = ".fetched"
PROGRESS_BAR_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
MAX_DOWNLOAD_ENV = "LOOPWISE_MAX_DOWNLOAD_MB"
DEFAULT_MAX_DOWNLOAD_MB = 4096.0
"""The default limit of one download (MB): the largest checkpoint a loopwise recipe plausibly writes fits it (a
fine-tune of a ~300 M-parameter network with AdamW keeps weights and two moments in float32, 12 bytes a parameter:
~3.6 GB; the image recipe's ResNet-18 writes ~140 MB), while a file much larger from a shared store is more likely the
wrong artifact than a checkpoint, and would cost minutes and disk before any check could read it. Raise it with
``LOOPWISE_MAX_DOWNLOAD_MB`` for larger networks."""
PROGRESS_ABOVE_MB = 100.0  # downloads above this say when they start and end, with MLflow's progress bar between


@dataclass(frozen=True)
class Fetched:
    """A run's checkpoint as a local file, and whether it came from the store just now (``False``: cached)."""

    path: Path
    downloaded: bool


def fetched_folder(root: str | Path, run_id: str) -> Path:
    """``<root>/.fetched/<run id>``: where a run's fetched checkpoints are kept."""
    return Path(root) / FETCHED_DIR / run_id


def max_download_mb() -> tuple[float, str]:
    """The download limit in megabytes and how to show it (``LOOPWISE_MAX_DOWNLOAD_MB`` as the user wrote it, else
    the default); raises ``CheckpointError`` for a value that is not a positive number."""
    text = os.environ.get(MAX_DOWNLOAD_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_DOWNLOAD_MB, f"{DEFAULT_MAX_DOWNLOAD_MB:,.0f}"
    try:
        limit = float(text)
    except ValueError:
        limit = float("nan")
    if not limit > 0 or limit == float("inf"):
        raise CheckpointError(f"{MAX_DOWNLOAD_ENV}={text!r}: expected a number of megabytes above 0 (the largest "
                              f"checkpoint download allowed; default {DEFAULT_MAX_DOWNLOAD_MB:,.0f})")
    return limit, text


def check_download_size(size: int | None, artifact: str, run_id: str, reference: str, folder: Path) -> None:
    """Refuse (``CheckpointError``, one line) a download of ``size`` bytes (the store's listing; ``None``: not
    listed) above the limit (``max_download_mb``) or larger than the free space under ``folder``."""
    limit, shown = max_download_mb()
    if size is None:
        return
    if size > limit * 1e6:
        raise CheckpointError(
            f"--ckpt_path {reference}: {artifact} of run {run_id} is {size / 1e6:,.2f} MB, above the download limit "
            f"of {shown} MB ({MAX_DOWNLOAD_ENV}); nothing was downloaded: if that file is the checkpoint you expect, "
            f"raise the limit ({MAX_DOWNLOAD_ENV}={size / 1e6 + 1:.0f}), else choose another run or a local file"
        )
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    free = shutil.disk_usage(existing).free if existing is not None else None
    if free is not None and size > free:
        raise CheckpointError(
            f"--ckpt_path {reference}: {artifact} of run {run_id} is {size / 1e6:,.2f} MB but only "
            f"{free / 1e6:,.2f} MB are free under {existing}; nothing was downloaded: free some space or set "
            "--checkpoints_dir on a larger disk"
        )


def download_checked(client: Any, run_id: str, artifact: str, size: int | None, into: Path, reference: str) -> Path:
    """``client.download_artifacts(run_id, artifact, into)`` after ``check_download_size``; a large download says
    when it starts and ends (rank 0), with MLflow's progress bar between unless the user set it, a small one is
    quiet. Raises ``CheckpointError`` (too large) and what MLflow raises."""
    check_download_size(size, artifact, run_id, reference, into)
    large = size is not None and size > PROGRESS_ABOVE_MB * 1e6
    bar = os.environ.get(PROGRESS_BAR_ENV)
    if bar is None:  # MLflow's bar on stderr only for a large file, unless the user asks otherwise
        os.environ[PROGRESS_BAR_ENV] = "true" if large else "false"
    started = time.monotonic()
    if large and rank_zero_only.rank == 0:
        print(f"recipes: downloading {artifact} of run {run_id} ({size / 1e6:,.1f} MB) from the store ...", flush=True)
    try:
        local = Path(client.download_artifacts(run_id, artifact, str(into)))
    finally:
        if bar is None:
            os.environ.pop(PROGRESS_BAR_ENV, None)
    if large and rank_zero_only.rank == 0:
        print(f"recipes: downloaded {artifact} of run {run_id} ({size / 1e6:,.1f} MB) in "
              f"{time.monotonic() - started:,.0f} s", flush=True)
    return local


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
    size = listed[artifact].file_size
    check_download_size(size, artifact, run_id, reference, folder)
    folder.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{alias}-", dir=folder))
    if rank_zero_only.rank == 0:
        print(f"recipes: fetching {artifact} of run {run_id}"
              f"{f' ({size / 1e6:,.1f} MB)' if size else ''} from the store", flush=True)
    try:
        local = download_checked(client, run_id, artifact, size, staging, reference)
        os.replace(local, target)
        stamp.write_text(version, encoding="utf-8")
    except (MlflowException, OSError) as err:
        raise FileNotFoundError(f"--ckpt_path {reference}: could not fetch {artifact} of run {run_id}: "
                                f"{str(err).splitlines()[0][:200]}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Fetched(target.resolve(), downloaded=True)


__all__ = ["DEFAULT_MAX_DOWNLOAD_MB", "FETCHED_DIR", "Fetched", "MAX_DOWNLOAD_ENV", "check_download_size",
           "download_checked", "fetch_checkpoint", "fetched_folder", "max_download_mb"]
