"""Where a recipe's checkpoints live: ``<checkpoints_dir>/<experiment>/<run id>/{best,last}.ckpt``, and what
``--ckpt_path best|last|run:<run id>/best|last|mlflow:<run id>/best|last|<file>`` points at."""

from __future__ import annotations

import re
import tempfile
import warnings
from datetime import datetime
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lightning_modules.compat import checkpoint_state_key, epoch_batches_done
from recipes.checkpoint_choice import choose_checkpoint
from recipes.recreated_runs import current_run_id
from recipes.tracking import CHECKPOINT_ARTIFACT_DIR, default_tracking_uri, find_mlflow_logger

ALIASES = ("best", "last")
MLFLOW_REF = re.compile(r"^mlflow:(?P<run_id>[^/\s]+)/(?P<alias>best|last)$")
RUN_REF = re.compile(r"^run:(?P<run_id>[^/\s]+)/(?P<alias>best|last)$")


class RunCheckpoint(ModelCheckpoint):
    """One checkpoint file per run that a recipe keeps up to date: ``best.ckpt`` or ``last.ckpt``.

    ``alias="best"`` keeps the checkpoint with the best value of ``monitor``; ``alias="last"`` is rewritten after
    every validation. Two callbacks instead of ``save_last=True`` because since Lightning 2.6 ``save_last`` only
    writes ``last.ckpt`` when a top-k checkpoint is saved at the same step, so with ``save_top_k=1`` it silently
    becomes a copy of the best checkpoint and resuming from it rewinds training.

    Files go to ``<root>/<experiment>/<MLflow run id>/`` (or a timestamp when no MLflow logger is attached), so
    runs never overwrite each other's checkpoints.

    ``alias="last", every_n_steps=N`` is a second writer of ``last.ckpt`` beside the one after every validation:
    Lightning's ``every_n_train_steps`` writes it every N optimizer steps, in the middle of epochs (then a hard kill
    loses at most N steps). It leaves out the epoch's last batch, whose ``last.ckpt`` the other one writes after
    the epoch's validation (a file written before it would resume as if that validation had run).

    Args:
        root: Directory that holds the checkpoints of every experiment.
        experiment: Experiment name (the recipe's file stem).
        alias: "best" or "last".
        monitor: Metric that defines the best checkpoint (``alias="best"`` only).
        mode: "min" or "max" for ``monitor``.
        every_n_steps: ``alias="last"`` only: write every this many optimizer steps instead of after validations.
    """

    def __init__(
        self,
        root: str | Path,
        experiment: str,
        alias: Literal["best", "last"],
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        every_n_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        if alias not in ALIASES:
            raise ValueError(f"RunCheckpoint: alias must be one of {ALIASES}, got {alias!r}")
        if alias == "best" and not monitor:
            raise ValueError("RunCheckpoint(alias='best') needs the metric to monitor")
        if every_n_steps is not None and (alias != "last" or every_n_steps < 1):
            raise ValueError(f"RunCheckpoint: every_n_steps is for alias='last' and >= 1, got {every_n_steps!r}")
        if every_n_steps is not None:
            kwargs["every_n_train_steps"] = every_n_steps
        super().__init__(
            filename=alias,
            monitor=monitor if alias == "best" else None,
            mode=mode,
            save_top_k=1,
            save_last=False,
            auto_insert_metric_name=False,
            enable_version_counter=False,
            **kwargs,
        )
        self.alias = alias
        self.root = Path(root)
        self.experiment = experiment
        self.every_n_steps = every_n_steps

    @property
    def state_key(self) -> str:
        # Lightning reads it at every callback hook call (the profiler's action name): built once per identity
        identity = (self.alias, self.monitor, self.mode, self.every_n_steps)
        if getattr(self, "_state_key_identity", None) != identity:
            self._state_key_identity = identity
            steps = {} if self.every_n_steps is None else {"every_n_steps": self.every_n_steps}
            self._state_key = checkpoint_state_key(
                self, alias=self.alias, monitor=self.monitor, mode=self.mode, **steps
            )
        return self._state_key

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.every_n_steps is not None and epoch_batches_done(trainer):
            return  # the epoch's last batch: last.ckpt is written after its validation (or at the epoch's end)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            logger = find_mlflow_logger(trainer.loggers)
            run = logger.run_id if logger is not None else datetime.now().strftime("run-%Y%m%d-%H%M%S")
            dirpath = str((self.root / self.experiment / str(run)).resolve())
            # under DDP only rank 0 knows the MLflow run id (other ranks' loggers have none): every rank takes
            # rank 0's directory, so the ranks agree on where best/last live (rank 0 writes the files)
            self.dirpath = trainer.strategy.broadcast(dirpath)
        with warnings.catch_warnings():
            # the folder is this run's own (its journal, lock and upload ledger, a resume's checkpoints): Lightning's
            # "exists and is not empty" warning, meant for a folder shared by runs, said nothing on every fit
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)

    @property
    def path(self) -> Path | None:
        """This callback's file, ``<dirpath>/<alias>.ckpt`` (``None`` before ``setup`` chose the directory)."""
        return None if self.dirpath is None else Path(self.dirpath) / f"{self.alias}.ckpt"

    def artifact_files(self) -> dict[str, str]:
        """``{artifact name: local file}`` for a logger that uploads checkpoints: ``{alias: newest file}``."""
        return {self.alias: self.best_model_path}

    def save_now(self, trainer: pl.Trainer) -> str:
        """Write this callback's checkpoint at once, outside Lightning's saving schedule (e.g. when a signal stops
        training), as its newest file; loggers are told as after a scheduled save. Returns the path."""
        path = str(self.path)
        trainer.save_checkpoint(path)
        self.best_model_path = self.last_model_path = path
        for logger in trainer.loggers:
            logger.after_save_checkpoint(self)
        return path


def download_run_checkpoint(run_id: str, alias: str, root: str | Path, tracking_uri: str | None = None) -> str:
    """Download ``checkpoints/<alias>.ckpt`` of an MLflow run to a fresh directory.

    The file lands in ``<root>/<experiment>/<run_id>/downloaded/<alias>-<random>/checkpoints/<alias>.ckpt``, a new
    directory every time, so it never overwrites a file (nor the run's own ``best.ckpt``/``last.ckpt``).
    Raises ``FileNotFoundError`` when the run or the artifact does not exist. The old id of a run that ``recipes
    sync`` recreated names the recreated run.
    """
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    uri = tracking_uri or default_tracking_uri()
    ref = f"--ckpt_path mlflow:{run_id}/{alias}"
    client = MlflowClient(uri)
    run_id = current_run_id(client, run_id) or run_id  # a run `recipes sync` recreated is found by its old id
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise FileNotFoundError(f"{ref}: no MLflow run {run_id!r} in {uri}") from err
    artifact = f"{CHECKPOINT_ARTIFACT_DIR}/{alias}.ckpt"
    present = {a.path for a in client.list_artifacts(run_id, CHECKPOINT_ARTIFACT_DIR)}
    if artifact not in present:
        has = ", ".join(sorted(present)) or "no checkpoints"
        raise FileNotFoundError(f"{ref}: run {run_id} has no artifact {artifact} ({has})")
    experiment = client.get_experiment(run.info.experiment_id)
    name = experiment.name if experiment is not None else "unknown"
    base = Path(root) / name / run_id / "downloaded"
    base.mkdir(parents=True, exist_ok=True)
    target = tempfile.mkdtemp(prefix=f"{alias}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-", dir=base)
    try:
        local = client.download_artifacts(run_id, artifact, target)
    except (MlflowException, OSError) as err:
        raise FileNotFoundError(f"{ref}: could not download {artifact}: {err}") from err
    return str(Path(local).resolve())


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """The file a ``--ckpt_path`` reference names, and its content when resolving it read the file already."""

    path: str
    loaded: Any = None


def resolve_checkpoint(
    ckpt_path: str,
    experiment: str,
    root: str | Path,
    tracking_uri: str | None = None,
    data_now: Mapping[str, Any] | None = None,
) -> ResolvedCheckpoint:
    """Turn a ``--ckpt_path`` reference into a checkpoint file and check that it exists:

    * ``best`` / ``last``: chosen among the experiment's tracked fit runs (``checkpoint_choice``; candidates whose
      data settings differ from ``data_now`` are skipped); the choice is printed.
    * ``run:<run id>/best|last``: that run's local file; ``mlflow:<run id>/best|last``: a downloaded copy of that
      run's checkpoint artifact; anything else: a file path.

    Raises ``FileNotFoundError`` naming what was looked for.
    """
    ref = MLFLOW_REF.match(ckpt_path)
    if ref is not None:
        return ResolvedCheckpoint(download_run_checkpoint(ref["run_id"], ref["alias"], root, tracking_uri))
    if ckpt_path.startswith("mlflow:"):
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: expected mlflow:<run id>/best or mlflow:<run id>/last")
    ref = RUN_REF.match(ckpt_path)
    if ref is not None:
        path = Path(root) / experiment / ref["run_id"] / f"{ref['alias']}.ckpt"
        if not path.is_file():
            raise FileNotFoundError(
                f"--ckpt_path {ckpt_path}: no {path.resolve()} (a run of experiment {experiment!r} under "
                f"{Path(root).resolve()}; mlflow:{ref['run_id']}/{ref['alias']} fetches the run's uploaded copy)"
            )
        return ResolvedCheckpoint(str(path.resolve()))
    if ckpt_path.startswith("run:"):
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: expected run:<run id>/best or run:<run id>/last")
    if ckpt_path in ALIASES:
        choice = choose_checkpoint(ckpt_path, experiment, root, tracking_uri or default_tracking_uri(), data_now)
        if rank_zero_only.rank == 0:
            print(f"recipes: --ckpt_path {ckpt_path} = {choice.path} ({choice.description})", flush=True)
        return ResolvedCheckpoint(choice.path, choice.checkpoint)
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path: checkpoint file not found: {path.resolve()}")
    return ResolvedCheckpoint(str(path.resolve()))
