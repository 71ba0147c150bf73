"""The MLflow run of a trainer, as callbacks write to it: tags, params, texts, figures and files.

Callbacks never reach into a logger's MLflow client themselves; they ask ``tracked_run(trainer)`` for the run and
write through it. Without an MLflow logger there is no run (``None``) and nothing is written. Under DDP the MLflow
client of a rank other than 0 is Lightning's no-op stand-in, so writes from those ranks do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.loggers import MLFlowLogger

from recipes.tracking.end_of_run import keep_figure, keep_model
from recipes.tracking.failures import lost_insert_race
from recipes.tracking.logger import find_mlflow_logger


def pip_requirements() -> list[str]:
    """The installed versions of what the loopwise MLflow model imports (loopwise itself runs from its checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = []
    for package in ("torch", "lightning", "torchmetrics", "mlflow", "pandas", "numpy", "jsonargparse"):
        try:
            pinned.append(f"{package}=={version(package)}")
        except PackageNotFoundError:
            continue
    return pinned


@dataclass(frozen=True)
class TrackedRun:
    """One MLflow run, written through the trainer's MLflow logger."""

    logger: MLFlowLogger

    @property
    def run_id(self) -> str | None:
        """The MLflow run id (``None`` on DDP ranks other than 0, unless given)."""
        return self.logger.run_id

    @property
    def tracking_uri(self) -> str:
        """The tracking store the run lives in."""
        return str(self.logger.experiment.tracking_uri)

    def _write(self, action: Callable[[], Any], default: Any = None) -> Any:
        """Run one store write; when the store refuses it and the logger keeps a journal (``RecipeLogger``), warn
        once through the logger and go on (the journal keeps the record); otherwise the error propagates. Once the
        store has refused a write, nothing more is sent to it (no call waits on a store that is down)."""
        if getattr(self.logger, "store_failure", None) is not None:
            return default
        try:
            return action()
        except Exception as err:
            failed = getattr(self.logger, "store_failed", None)
            if not callable(failed):
                raise
            failed(err)
            return default

    def log_inputs(self, inputs: list[Any]) -> None:
        """Log MLflow dataset inputs (``mlflow.entities.DatasetInput``) to the run; once more when another run of the
        experiment inserted the same dataset at the same moment (``lost_insert_race``: the second try links it)."""

        def write() -> None:
            client, run_id = self.logger.experiment, self.logger.run_id
            try:
                client.log_inputs(run_id, datasets=inputs)
            except Exception as err:
                if not lost_insert_race(err):
                    raise
                client.log_inputs(run_id, datasets=inputs)

        self._write(write)

    def set_tag(self, key: str, value: Any, synchronous: bool = True) -> None:
        """Set one run tag (as a string); with ``synchronous`` off, held with the logger's metrics when it holds them
        (``RecipeLogger.hold_tag``), else through MLflow's asynchronous queue (the journal has it at once either way:
        a tag written on every checkpoint save keeps the training thread off the store)."""
        hold = getattr(self.logger, "hold_tag", None)
        if not synchronous and callable(hold):
            hold(key, value)
            return
        record = getattr(self.logger, "record", None)
        if callable(record):
            record("tags", values={key: str(value)})
        run_id, text = self.logger.run_id, str(value)
        self._write(lambda: self.logger.experiment.set_tag(run_id, key, text, synchronous=synchronous))

    def log_text(self, text: str, artifact_file: str) -> None:
        """Write ``text`` as the run artifact ``artifact_file`` (also kept in the run's journal, when it has one:
        ``recipes sync`` logs it into a run the store recreated)."""
        self._write(lambda: self.logger.experiment.log_text(self.logger.run_id, text, artifact_file))
        record = getattr(self.logger, "record", None)
        if callable(record):
            record("text", name=artifact_file, text=text)

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Write a matplotlib figure as the run artifact ``artifact_file`` (a PNG name); a store that is down gets it
        from the replay of the run's journal (``end_of_run.keep_figure``)."""
        written = self._write(lambda: self.logger.experiment.log_figure(self.logger.run_id, figure, artifact_file)
                              or True)
        if not written and getattr(self.logger, "store_failure", None) is not None:
            keep_figure(self.logger, figure, artifact_file)

    def log_file(self, local_path: str, artifact_dir: str | None = None) -> None:
        """Copy a local file into the run's artifacts (under ``artifact_dir``)."""
        self._write(lambda: self.logger.experiment.log_artifact(self.logger.run_id, local_path, artifact_dir))

    def checkpoint_saved(self) -> None:
        """A checkpoint is being saved: make every metric logged so far durable in the run's journal and hand it to
        the store in the background (the logger's ``checkpoint_saved`` when it has one: ``RecipeLogger``)."""
        saved = getattr(self.logger, "checkpoint_saved", None)
        if callable(saved):
            saved()

    def flush_metrics(self) -> None:
        """Make every metric logged so far durable in the store (the logger's ``flush_metrics`` when it has one)."""
        flush = getattr(self.logger, "flush_metrics", None)
        if callable(flush):
            flush()

    def log_pyfunc_model(
        self,
        code_path: str,
        artifacts: dict[str, str],
        model_config: dict[str, Any],
        input_example: tuple[Any, Any] | None,
        registered_model_name: str | None = None,
        name: str | None = None,
        best: tuple[str, float] | None = None,
        uri_tag: str | None = None,
    ) -> tuple[str | None, str | None]:
        """Log an MLflow pyfunc model "from code" (``code_path``) as an MLflow 3 logged model ``name`` (``None``: the
        run's name) of this run
        (``recipes.tracking.logged_model``), with a signature inferred from ``input_example`` (inputs, outputs; its input columns optional,
        so the model's own check names a missing one, and columns of numbers typed Any, so that MLflow's server
        hands the model a JSON ``true`` or ``null`` as it was sent, for its check to name), and
        register it as a new version of ``registered_model_name`` when given. ``best`` (monitored metric, its best
        value) picks the step whose metrics are linked to the model (the best checkpoint's); without it, the run's
        last logged step. Returns the model's URI (``models:/<model id>``) and the registered version (``None`` when
        not registered); a store that refuses it is the run's store failure (one warning, the fit goes on: ``None,
        None``), and with ``uri_tag`` (the run tag naming the model's URI) the model is kept in the run's folder, logged,
        tagged and registered by the replay of its journal (``end_of_run.keep_model``). Only this run's client is used: MLflow's global tracking URI (and the
        ``MLFLOW_TRACKING_URI`` it exports) stay as they are."""
        import mlflow
        from mlflow.models import ModelSignature, infer_signature
        from mlflow.types.schema import AnyType, ColSpec, DataType, Schema

        from recipes.tracking.logged_model import (
            MODEL_URI_PREFIX, best_step, last_step, log_logged_model, register_logged_model,
        )
        from recipes.tracking.quiet_mlflow import quiet_model_logging

        client, run_id = self.logger.experiment, self.logger.run_id
        signature, example = None, None
        if input_example is not None:
            example = input_example[0]
            with quiet_model_logging():  # MLflow's hint about integer columns: the class index, the model's check
                signature = infer_signature(input_example[0], input_example[1])
            columns = signature.inputs.inputs
            if all(isinstance(c, ColSpec) for c in columns):
                # optional columns: a missing one reaches the model's own check, whose error names it in one line;
                # a column of numbers is typed Any: MLflow's server casts to the type before the model sees a row (a
                # JSON true becomes 1, a null is refused naming no row), the model's check names every bad value
                numbers = {DataType.integer, DataType.long, DataType.float, DataType.double, DataType.boolean}
                inputs = Schema([
                    ColSpec(AnyType() if isinstance(c.type, DataType) and c.type in numbers else c.type, c.name,
                            required=False)
                    for c in columns
                ])
                signature = ModelSignature(inputs=inputs, outputs=signature.outputs)
        self.flush_metrics()  # the metrics to link are in the store
        step = self._write(lambda: best_step(client, run_id, *best)) if best is not None else None
        step = self._write(lambda: last_step(client, run_id)) if step is None else step

        def save(path: str, mlflow_model: Any) -> None:
            with quiet_model_logging():  # MLflow's notes on the type hints, the example, the checkpoint's copy
                mlflow.pyfunc.save_model(
                    path=path,
                    python_model=code_path,
                    artifacts=artifacts,
                    model_config=model_config,
                    signature=signature,
                    input_example=example,
                    mlflow_model=mlflow_model,
                    # named here rather than inferred: MLflow's inference runs the model in a subprocess (seconds)
                    pip_requirements=pip_requirements(),
                )

        checkpoint = {"loopwise.checkpoint": Path(artifacts["checkpoint"]).name} if "checkpoint" in artifacts else {}

        def log() -> tuple[str | None, str | None]:
            model_id = log_logged_model(client, run_id, name, step, checkpoint, save)
            version = register_logged_model(client, registered_model_name, model_id, run_id) if (
                registered_model_name is not None) else None  # fmt: skip
            return f"{MODEL_URI_PREFIX}{model_id}", version

        logged = self._write(log)
        if logged is None and uri_tag is not None and getattr(self.logger, "store_failure", None) is not None:
            keep_model(self.logger, save, {"name": name, "best": list(best) if best else None, "tags": checkpoint,
                                           "registered_model_name": registered_model_name, "uri_tag": uri_tag})
        return logged or (None, None)

    def logged_params(self) -> dict[str, str]:
        """The params the run holds now (as MLflow stores them: strings)."""
        return self._write(lambda: dict(self.logger.experiment.get_run(self.logger.run_id).data.params), {})

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
