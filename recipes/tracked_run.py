"""The MLflow run of a trainer, as callbacks write to it: tags, params, texts, figures and files.

Callbacks never reach into a logger's MLflow client themselves; they ask ``tracked_run(trainer)`` for the run and
write through it. Without an MLflow logger there is no run (``None``) and nothing is written. Under DDP the MLflow
client of a rank other than 0 is Lightning's no-op stand-in, so writes from those ranks do nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger

from recipes.tracking import find_mlflow_logger


@dataclass(frozen=True)
class TrackedRun:
    """One MLflow run, written through the trainer's MLflow logger."""

    logger: MLFlowLogger

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (``None`` on DDP ranks other than 0, unless given)."""
        return self.logger.run_id

    def set_tag(self, key: str, value: Any) -> None:
        """Set one run tag (as a string)."""
        self.logger.experiment.set_tag(self.logger.run_id, key, str(value))

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write ``text`` as the run artifact ``artifact_file``."""
        self.logger.experiment.log_text(self.logger.run_id, text, artifact_file)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Write a matplotlib figure as the run artifact ``artifact_file`` (a PNG name)."""
        self.logger.experiment.log_figure(self.logger.run_id, figure, artifact_file)

    def log_file(self, local_path: str, artifact_dir: str | None = None) -> None:
        """Copy a local file into the run's artifacts (under ``artifact_dir``)."""
        self.logger.experiment.log_artifact(self.logger.run_id, local_path, artifact_dir)

    def logged_params(self) -> dict[str, str]:
        """The params the run holds now (as MLflow stores them: strings)."""
        return dict(self.logger.experiment.get_run(self.logger.run_id).data.params)

    def log_params_once(self, params: dict[str, Any]) -> dict[str, tuple[str, Any]]:
        """Log the params the run does not hold yet; return ``{param: (logged value, new value)}`` for those it holds
        with another value.

        MLflow refuses to change a logged param, so on a continued run a changed value keeps the first one and the
        new value is recorded as the tag ``loopwise.resumed.<param>``. Values compare as Lightning logs them (str,
        250 characters).
        """
        already = self.logged_params()
        changed = {k: (already[k], v) for k, v in params.items() if k in already and already[k] != str(v)[:250]}
        new = {k: v for k, v in params.items() if k not in already}
        if new:
            self.logger.log_hyperparams(new)
        for key, (_, value) in changed.items():
            self.set_tag(f"loopwise.resumed.{key}", value)
        return changed


def tracked_run(trainer: pl.Trainer) -> TrackedRun | None:
    """The MLflow run of ``trainer``'s first MLflow logger, or ``None`` when it has none."""
    logger = find_mlflow_logger(trainer.loggers)
    return None if logger is None else TrackedRun(logger)


__all__ = ["TrackedRun", "tracked_run"]
