"""MLflow tracking: the embedded SQLite default, or a server named by MLFLOW_TRACKING_URI."""

from __future__ import annotations

import os
from datetime import datetime, timezone
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

CHECKPOINT_ARTIFACT_DIR = "checkpoints"


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set (read now, not at import), else ``sqlite:///<cwd>/mlflow.db``."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


class RecipeLogger(MLFlowLogger):
    """Lightning's MLflow logger with loopwise defaults.

    The tracking URI is resolved when the logger is built (``MLFLOW_TRACKING_URI``, else an SQLite file
    ``mlflow.db`` in the working directory with artifacts under ``./mlruns``). Checkpoints are logged as run
    artifacts under fixed names, ``checkpoints/best.ckpt`` and ``checkpoints/last.ckpt``.

    Under DDP only global rank 0 talks to MLflow (one run): ``experiment`` is Lightning's ``rank_zero_experiment``
    (a no-op object on other ranks, where ``run_id`` stays ``None`` unless given), and the methods below that write
    to the run are ``rank_zero_only``.

    Args:
        experiment_name: MLflow experiment; default: the recipe's file stem.
        run_name: MLflow run name; default: ``<experiment>-<UTC time>`` (MLflow's own random names repeat between
            runs, since its generator follows the seeded ``random`` module).
        tracking_uri: Tracking server or database URI; default: ``MLFLOW_TRACKING_URI`` or ``./mlflow.db``.
        tags: Extra run tags.
        log_model: Upload the best and last checkpoints: ``true`` at the end of the run, ``all`` after every save,
            ``false`` never.
        run_id: Continue this existing run instead of creating one.
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, str] | None = None,
        log_model: Literal[True, False, "all"] = True,
        run_id: str | None = None,
    ) -> None:
        super().__init__(
            experiment_name=experiment_name or "loopwise",
            run_name=run_name or f"{experiment_name or 'loopwise'}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S-%f}",
            tracking_uri=tracking_uri or default_tracking_uri(),
            tags=dict(tags) if tags else None,
            log_model=log_model,
            run_id=run_id,
        )
        self._checkpoint_callbacks: dict[str, ModelCheckpoint] = {}
        self.resumed = run_id is not None
        self.killed_by: str | None = None  # set by ``RunContinuity`` when SIGTERM/SIGINT interrupts training

    @property
    def experiment_name(self) -> str:
        """Name of the MLflow experiment this logger writes to."""
        return self._experiment_name

    def add_tags(self, tags: dict[str, Any]) -> None:
        """Tags for the run: set at creation if it does not exist yet, else written to it now (rank 0)."""
        if self._initialized and rank_zero_only.rank == 0:
            for key, value in tags.items():
                self.experiment.set_tag(self.run_id, key, str(value))
        else:
            self.tags = {**(self.tags or {}), **{k: str(v) for k, v in tags.items()}}

    @rank_zero_only
    def reopen(self) -> None:
        """Mark a continued run (``run_id`` given) as RUNNING again (it may have ended FINISHED, FAILED or KILLED,
        or still read RUNNING after a hard kill) and write the tags that only a new run would get at creation."""
        if self.resumed:
            self.experiment.update_run(self.run_id, status="RUNNING")
            for key, value in (self.tags or {}).items():
                self.experiment.set_tag(self.run_id, key, str(value))

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        """Remember every checkpoint callback (Lightning's logger keeps only the latest); upload now for "all"."""
        self._checkpoint_callbacks[checkpoint_callback.state_key] = checkpoint_callback
        if self._log_model == "all":
            self.upload_checkpoints(checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if self._initialized and self._log_model:
            for callback in self._checkpoint_callbacks.values():
                self.upload_checkpoints(callback)
        self._checkpoint_callback = None  # uploaded above, under fixed names
        if status == "failed" and self.killed_by is not None:
            status = "KILLED"  # MLflow's RunStatus for a run stopped from outside (SIGTERM, Ctrl+C)
        super().finalize(status)

    @rank_zero_only
    def upload_checkpoints(self, checkpoint_callback: ModelCheckpoint) -> None:
        """Upload a callback's checkpoints as ``checkpoints/best.ckpt`` / ``checkpoints/last.ckpt``.

        A ``RunCheckpoint`` names its own alias; a plain ``ModelCheckpoint`` gives its best and last paths.
        Files already uploaded unchanged are skipped.
        """
        alias = getattr(checkpoint_callback, "alias", None)
        if alias is not None:
            pairs = [(alias, checkpoint_callback.best_model_path)]
        else:
            pairs = [("best", checkpoint_callback.best_model_path), ("last", checkpoint_callback.last_model_path)]
        for name, path in pairs:
            if not path or not os.path.isfile(path):
                continue
            stamp = os.path.getmtime(path)
            if self._logged_model_time.get(name) == stamp:
                continue
            if Path(path).name == f"{name}.ckpt":
                self.experiment.log_artifact(self.run_id, path, CHECKPOINT_ARTIFACT_DIR)
            else:
                with tempfile.TemporaryDirectory() as tmp:
                    staged = Path(tmp) / f"{name}.ckpt"
                    shutil.copyfile(path, staged)
                    self.experiment.log_artifact(self.run_id, str(staged), CHECKPOINT_ARTIFACT_DIR)
            self._logged_model_time[name] = stamp


def log_params_once(logger: MLFlowLogger, params: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """Log the params the run does not hold yet; return ``{param: (logged value, new value)}`` for those it
    holds with another value.

    MLflow refuses to change a logged param, so on a continued run a changed value keeps the first one and the new
    value is recorded as the tag ``loopwise.resumed.<param>``. Values compare as Lightning logs them (str, 250
    characters).
    """
    already = logger.experiment.get_run(logger.run_id).data.params
    changed = {k: (already[k], v) for k, v in params.items() if k in already and already[k] != str(v)[:250]}
    new = {k: v for k, v in params.items() if k not in already}
    if new:
        logger.log_hyperparams(new)
    for key, (_, value) in changed.items():
        logger.experiment.set_tag(logger.run_id, f"loopwise.resumed.{key}", str(value))
    return changed


def find_mlflow_logger(loggers: list[Any]) -> MLFlowLogger | None:
    """The first MLflow logger of a trainer, or ``None``."""
    return next((lg for lg in loggers if isinstance(lg, MLFlowLogger)), None)
