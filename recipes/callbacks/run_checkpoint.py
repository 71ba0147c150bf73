"""``RunCheckpoint``: the callback that keeps a run's ``best.ckpt`` or ``last.ckpt`` in
``<checkpoints_dir>/<experiment>/<run id>/`` up to date."""

from __future__ import annotations

import warnings
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_modules.read_steps import epoch_batches_done
from recipes.checkpoints.locations import ALIASES
from recipes.compat.internals import checkpoint_state_key, skip_batch_hooks
from recipes.checkpoints.atomic_io import remove_leftover_temp_files
from recipes.checkpoints.resumed_best import ResumedBest, describe_resume, fetch_from_store, repointed, restore_best
from recipes.tracking.logger import find_mlflow_logger
from recipes.tracking.tracked_run import tracked_run



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
        resumed_from: ``--ckpt_path`` as the user gave it (``mlflow:<id>/last``, a file), named in the line a
            resumed fit prints (``alias="best"``).

    A fit resumed from a checkpoint written in another folder (``mlflow:<id>/last`` in another directory, a copied
    ``last.ckpt``) keeps its state, re-pointed to this run's folder, and the best checkpoint file
    (``recipes.checkpoints.resumed_best``), where Lightning would drop the best and warn that the dirpath changed.
    """

    def __init__(
        self,
        root: str | Path,
        experiment: str,
        alias: Literal["best", "last"],
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        every_n_steps: int | None = None,
        resumed_from: str | None = None,
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
        # a step or time trigger: only then can Lightning's per-batch hook save (its check costs ~10 us a batch)
        self.saves_within_epochs = (kwargs.get("every_n_train_steps") or 0) >= 1 or (
            kwargs.get("train_time_interval") is not None
        )
        # Lightning then skips the batch hooks of this callback, even its per-batch check (none without a trigger)
        skip_batch_hooks(self, ("on_train_batch_end",) if self.saves_within_epochs else ())
        self.resumed_from = resumed_from
        self._resumed_state: dict[str, Any] | None = None  # the state to load on resume, re-pointed to dirpath
        self._saving_at: tuple[int, int] | None = None  # (epoch, step) of the hook that may save now
        self._best_at: tuple[int, int] | None = None  # (epoch, step) where best_model_score was reached
        self._best_score_seen: Any = None  # the best_model_score that _best_at belongs to

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
        if not self.saves_within_epochs:
            return  # no every_n_train_steps and no train_time_interval: Lightning's hook would save nothing here
        if self.every_n_steps is not None and epoch_batches_done(trainer):
            return  # the epoch's last batch: last.ckpt is written after its validation (or at the epoch's end)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saving_at = (trainer.current_epoch, trainer.global_step)  # where a new best would be reached
        super().on_validation_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._saving_at = (trainer.current_epoch, trainer.global_step)
        super().on_train_epoch_end(trainer, pl_module)

    def state_dict(self) -> dict[str, Any]:
        """Lightning's state, plus the epoch and step where ``best_model_score`` was reached (``best_epoch``,
        ``best_step``: a resume names its best without reading ``best.ckpt``). Lightning saves the file of a new
        best right after setting it, inside the hook that noted ``_saving_at``."""
        state = super().state_dict()
        if self.best_model_score is not None and self.best_model_score is not self._best_score_seen:
            self._best_score_seen, self._best_at = self.best_model_score, self._saving_at
        if self._best_at is not None and self.best_model_score is not None:
            state["best_epoch"], state["best_step"] = self._best_at
        return state

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            logger = find_mlflow_logger(trainer.loggers)
            run = logger.run_id if logger is not None else datetime.now().strftime("run-%Y%m%d-%H%M%S")
            dirpath = str((self.root / self.experiment / str(run)).resolve())
            # under DDP only rank 0 knows the MLflow run id (other ranks' loggers have none): every rank takes
            # rank 0's directory, so the ranks agree on where best/last live (rank 0 writes the files)
            self.dirpath = trainer.strategy.broadcast(dirpath)
        if trainer.is_global_zero:  # a save killed here before (kill -9) left its temp file: gone at this start
            remove_leftover_temp_files(Path(self.dirpath))
        with warnings.catch_warnings():
            # the folder is this run's own (its journal, lock and upload ledger, a resume's checkpoints): Lightning's
            # "exists and is not empty" warning, meant for a folder shared by runs, said nothing on every fit
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # Lightning calls it with the whole checkpoint right before load_state_dict (which gets this callback's part)
        state = (checkpoint.get("callbacks") or {}).get(self.state_key)
        best = None
        if isinstance(state, dict) and self.dirpath is not None:
            if self.alias == "best":
                best = self.restore_best(trainer, state, checkpoint.get("global_step"))
                self._resumed_state = best.state
            elif state.get("dirpath") not in (None, self.dirpath):
                self._resumed_state = repointed(state, str(self.dirpath))
        if self.alias == "best" and trainer.is_global_zero:
            print(
                describe_resume(
                    Path(str(self.dirpath)).name, checkpoint.get("epoch"), checkpoint.get("global_step"),
                    self.resumed_from, self.monitor, best,
                ),
                flush=True,
            )

    def restore_best(self, trainer: pl.Trainer, state: dict[str, Any], step: int | None) -> ResumedBest:
        """The best this run keeps on resume (``resumed_best.restore_best``): rank 0 finds the file (here, in the
        folder the checkpoint was written in, or in the tracking store) and every rank loads the state it chose."""
        best = None
        if trainer.is_global_zero:
            run = tracked_run(trainer)
            uri = run.tracking_uri if run is not None else None

            def fetch(run_id: str, into: Path) -> Path | None:
                return fetch_from_store(uri, run_id, into) if uri else None

            best = restore_best(state, str(self.dirpath), self.state_key, step, fetch, trainer.ckpt_path)
            if best.file is not None and best.origin:  # put here now: uploaded as the run's checkpoints/best.ckpt
                for logger in trainer.loggers:
                    logger.after_save_checkpoint(self)
        return trainer.strategy.broadcast(best)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        resumed, self._resumed_state = self._resumed_state, None
        state = resumed if resumed is not None else state_dict
        super().load_state_dict(state)
        self._best_score_seen = self.best_model_score
        known = state.get("best_epoch") is not None and state.get("best_step") is not None
        self._best_at = (int(state["best_epoch"]), int(state["best_step"])) if known else None

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
