"""Where a recipe's checkpoints live, and what ``--ckpt_path best|last`` means."""

from __future__ import annotations

import re
import signal
import tempfile
import threading
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from recipes.tracking import CHECKPOINT_ARTIFACT_DIR, default_tracking_uri, find_mlflow_logger

ALIASES = ("best", "last")
STAMP_KEY = "loopwise"  # checkpoint["loopwise"] = {"mlflow_run_id": ..., "experiment": ...}
MLFLOW_REF = re.compile(r"^mlflow:(?P<run_id>[^/\s]+)/(?P<alias>best|last)$")


class RunCheckpoint(ModelCheckpoint):
    """One checkpoint file per run that a recipe keeps up to date: ``best.ckpt`` or ``last.ckpt``.

    ``alias="best"`` keeps the checkpoint with the best value of ``monitor``; ``alias="last"`` is rewritten after
    every validation. Two callbacks instead of ``save_last=True`` because since Lightning 2.6 ``save_last`` only
    writes ``last.ckpt`` when a top-k checkpoint is saved at the same step, so with ``save_top_k=1`` it silently
    becomes a copy of the best checkpoint and resuming from it rewinds training.

    Files go to ``<root>/<experiment>/<MLflow run id>/`` (or a timestamp when no MLflow logger is attached), so
    runs never overwrite each other's checkpoints.

    Args:
        root: Directory that holds the checkpoints of every experiment.
        experiment: Experiment name (the recipe's file stem).
        alias: "best" or "last".
        monitor: Metric that defines the best checkpoint (``alias="best"`` only).
        mode: "min" or "max" for ``monitor``.
    """

    def __init__(
        self,
        root: str | Path,
        experiment: str,
        alias: Literal["best", "last"],
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        **kwargs: Any,
    ) -> None:
        if alias not in ALIASES:
            raise ValueError(f"RunCheckpoint: alias must be one of {ALIASES}, got {alias!r}")
        if alias == "best" and not monitor:
            raise ValueError("RunCheckpoint(alias='best') needs the metric to monitor")
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

    @property
    def state_key(self) -> str:
        return self._generate_state_key(alias=self.alias, monitor=self.monitor, mode=self.mode)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.dirpath is None:
            logger = find_mlflow_logger(trainer.loggers)
            run = logger.run_id if logger is not None else datetime.now().strftime("run-%Y%m%d-%H%M%S")
            dirpath = str((self.root / self.experiment / str(run)).resolve())
            # under DDP only rank 0 knows the MLflow run id (other ranks' loggers have none): every rank takes
            # rank 0's directory, so the ranks agree on where best/last live (rank 0 writes the files)
            self.dirpath = trainer.strategy.broadcast(dirpath)
        super().setup(trainer, pl_module, stage)


class RunContinuity(Callback):
    """What makes a fit run resumable and ends it with the right MLflow status.

    * Every checkpoint carries ``checkpoint["loopwise"] = {"mlflow_run_id": ..., "experiment": ...}`` (plain
      strings, so ``torch.load(weights_only=True)`` reads it): ``recipes fit --ckpt_path`` continues that run.
    * SIGTERM (Lightning's signal connector raises ``SIGTERMException`` after the current batch) or SIGINT/Ctrl+C
      during fit: ``last.ckpt`` is written to the run's checkpoint directory and the run ends ``KILLED`` instead
      of ``FAILED``; the process exits 143 (SIGTERM) or 130 (SIGINT). A first SIGINT is routed into Lightning's
      SIGTERM path, so training stops at a batch boundary and the checkpoint is consistent; a second one raises
      ``KeyboardInterrupt`` at once (Lightning's own handling: the run still ends ``KILLED``, exit code 1, and no
      checkpoint is written since the interrupted step may be half done; the previous ``last.ckpt`` stays).
      Other exceptions leave Lightning's ``FAILED``.
    * Under DDP a signal only marks itself pending; after every train batch the ranks agree on it (an
      ``all_reduce``), so all of them stop after the same batch and save ``last.ckpt`` together. Lightning 2.6's
      own SIGTERM handler calls ``dist.broadcast`` inside the signal handler, at whatever point rank 0 is (e.g. in
      the forward pass while rank 1 waits in the backward all-reduce): a deadlock, so under DDP it is replaced
      during training too.
    * On a resumed run, curated params whose value changed (e.g. ``max_epochs`` raised to train longer) cannot be
      logged again (MLflow refuses a changed param): the new value is kept as the tag ``loopwise.resumed.<param>``
      (``recipes.tracking.log_params_once``) and the param keeps the value of the first start.
    """

    def __init__(self) -> None:
        self.interrupted: str | None = None
        self._pending_signal: int | None = None  # DDP only: the signal received and not yet agreed on (0: none)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.interrupted = None
        self._pending_signal = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._route_sigint(trainer)
        self._tag_resume(trainer)

    def _route_sigint(self, trainer: pl.Trainer) -> None:
        """First SIGINT: stop after the current batch like SIGTERM does; Lightning's teardown restores the handler
        that was installed before ``fit`` (it saves all handlers when it registers its own)."""
        if threading.current_thread() is not threading.main_thread():
            return
        connector = trainer._signal_connector
        distributed = trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

        def on_sigint(signum: int, frame: Any) -> None:
            if self.interrupted == "SIGINT" or self._pending_signal or not hasattr(connector, "received_sigterm"):
                raise KeyboardInterrupt
            if distributed:
                self._pending_signal = signal.SIGINT
            else:
                self.interrupted = "SIGINT"
                connector.received_sigterm = True
            print("SIGINT: stopping after this batch (press Ctrl+C again to abort at once)", flush=True)

        signal.signal(signal.SIGINT, on_sigint)
        if distributed:

            def on_sigterm(signum: int, frame: Any) -> None:
                self._pending_signal = signal.SIGTERM

            self._pending_signal = 0
            signal.signal(signal.SIGTERM, on_sigterm)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """DDP: agree on a pending signal (SIGTERM wins over SIGINT); every rank then stops after this batch."""
        if self._pending_signal is None:
            return
        flag = torch.tensor([int(self._pending_signal)], device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
        if agreed:
            self.interrupted = "SIGINT" if agreed == signal.SIGINT else "SIGTERM"
            if trainer.is_global_zero:
                print(f"{self.interrupted}: every process stops after this batch", flush=True)
            trainer._signal_connector.received_sigterm = True  # Lightning raises SIGTERMException on every rank

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        logger = find_mlflow_logger(trainer.loggers)
        if logger is None or logger.run_id is None:
            return
        checkpoint[STAMP_KEY] = {
            "mlflow_run_id": str(logger.run_id),
            "experiment": str(getattr(logger, "_experiment_name", "") or ""),
        }

    def _tag_resume(self, trainer: pl.Trainer) -> None:
        """On a continued run, record where it resumed (changed params are tagged by ``log_params_once``)."""
        logger = find_mlflow_logger(trainer.loggers)
        if logger is None or not trainer.is_global_zero or not getattr(logger, "resumed", False):
            return
        logger.experiment.set_tag(logger.run_id, "loopwise.resumed_at_step", str(trainer.global_step))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if isinstance(exception, SIGTERMException):
            self.interrupted = self.interrupted or "SIGTERM"
            exception.code = 128 + (signal.SIGINT if self.interrupted == "SIGINT" else signal.SIGTERM)
        else:  # a second Ctrl+C (or one before training started): the step may be half done, keep last.ckpt
            self.interrupted = "SIGINT"
        logger = find_mlflow_logger(trainer.loggers)
        if logger is not None and hasattr(logger, "killed_by"):
            logger.killed_by = self.interrupted
        last = next((c for c in trainer.checkpoint_callbacks if getattr(c, "alias", None) == "last"), None)
        if last is None or last.dirpath is None or trainer.state.fn != "fit":
            return
        if isinstance(exception, KeyboardInterrupt):
            return
        path = str(Path(last.dirpath) / f"{last.alias}.ckpt")
        try:
            trainer.save_checkpoint(path)
        except Exception as err:  # noqa: BLE001  (the run is ending anyway; say so and keep the status right)
            warnings.warn(f"RunContinuity: could not save {path} after {self.interrupted}: {err}", stacklevel=2)
            return
        last.best_model_path = last.last_model_path = path
        if logger is not None:
            logger.after_save_checkpoint(last)
        if trainer.is_global_zero:
            print(
                f"{self.interrupted} received: saved {path} at step {trainer.global_step}; "
                f"resume with --ckpt_path {path} (or last)",
                flush=True,
            )


def read_run_stamp(path: str | Path) -> dict[str, str]:
    """The ``loopwise`` stamp of a checkpoint (``{}`` when it has none or cannot be read as weights only)."""
    try:
        try:
            ckpt = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError:  # not a zip-format file: mmap is not possible
            ckpt = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001
        return {}
    stamp = ckpt.get(STAMP_KEY) if isinstance(ckpt, dict) else None
    return {str(k): str(v) for k, v in stamp.items()} if isinstance(stamp, dict) else {}


def download_run_checkpoint(run_id: str, alias: str, root: str | Path, tracking_uri: str | None = None) -> str:
    """Download ``checkpoints/<alias>.ckpt`` of an MLflow run to a fresh directory.

    The file lands in ``<root>/<experiment>/<run_id>/downloaded/<alias>-<random>/checkpoints/<alias>.ckpt``, a new
    directory every time, so it never overwrites a file (nor the run's own ``best.ckpt``/``last.ckpt``).
    Raises ``FileNotFoundError`` when the run or the artifact does not exist.
    """
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    uri = tracking_uri or default_tracking_uri()
    ref = f"--ckpt_path mlflow:{run_id}/{alias}"
    client = MlflowClient(uri)
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


def resolve_checkpoint(
    ckpt_path: str, experiment: str, root: str | Path, tracking_uri: str | None = None
) -> str:
    """Turn ``best``/``last`` into the newest such file of the experiment, ``mlflow:<run_id>/best|last`` into a
    downloaded copy of that run's checkpoint artifact; check that a path exists.

    Raises ``FileNotFoundError`` naming what was looked for.
    """
    ref = MLFLOW_REF.match(ckpt_path)
    if ref is not None:
        return download_run_checkpoint(ref["run_id"], ref["alias"], root, tracking_uri)
    if ckpt_path.startswith("mlflow:"):
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: expected mlflow:<run id>/best or mlflow:<run id>/last")
    if ckpt_path in ALIASES:
        base = Path(root) / experiment
        candidates = sorted(base.glob(f"*/{ckpt_path}.ckpt"), key=lambda p: p.stat().st_mtime)
        if not candidates:
            raise FileNotFoundError(
                f"--ckpt_path {ckpt_path}: no {ckpt_path}.ckpt for experiment {experiment!r} under "
                f"{base.resolve()}; run `recipes fit` first or give a checkpoint file"
            )
        return str(candidates[-1].resolve())
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path: checkpoint file not found: {path.resolve()}")
    return str(path.resolve())


# --- is this file a checkpoint we can use? ----------------------------------------------------------------------
FIT_KEYS = ("loops", "optimizer_states", "global_step", "epoch")
_UNSAFE_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (?P<name>[\w.]+)")


class CheckpointError(ValueError):
    """A ``--ckpt_path`` file that is not a usable checkpoint (unreadable, unsafe, foreign or for another model)."""


def load_checkpoint_weights_only(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU (memory-mapped when the file allows it), with the reason in
    a ``CheckpointError`` when the file is truncated, not a torch file, or needs to unpickle arbitrary objects.

    Weights-only loading never runs code from the file: a pickle that would call a function is refused, not run.
    """
    path = Path(path)
    try:
        try:
            return torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
            return torch.load(path, weights_only=True, map_location="cpu")  # not the zip format: no mmap
    except Exception as err:  # noqa: BLE001  (torch raises many types for a bad file; the message says which)
        raise CheckpointError(f"--ckpt_path {path}: {describe_load_error(path, err)}") from None


def describe_load_error(path: Path, err: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in one line."""
    text = str(err)
    unsafe = _UNSAFE_GLOBAL.search(text)
    if unsafe is not None or "Weights only load failed" in text:
        name = repr(unsafe["name"]) if unsafe is not None else "an object that is not a tensor or plain value"
        return (
            f"refused to load: the file needs to unpickle {name}, which could run arbitrary code; "
            "checkpoints written by recipes hold only tensors and plain values and never need it. Load it only if "
            "you trust its source, and re-save its state_dict"
        )
    size = path.stat().st_size if path.exists() else 0
    if size == 0:
        return "the file is empty (0 bytes): not a checkpoint"
    if "central directory" in text or "zip archive" in text or isinstance(err, EOFError):
        return (
            f"the file is truncated or corrupt ({size:,} bytes; torch: "
            f"{text.split('. ')[0][:120] or type(err).__name__})"
        )
    return f"not a PyTorch checkpoint file ({size:,} bytes; torch.load failed: {type(err).__name__} {text[:120]})"


def check_checkpoint(path: str | Path, subcommand: str | None) -> dict[str, Any]:
    """Load ``path`` weights-only and check it is a Lightning checkpoint: a dict with a ``state_dict``; for ``fit``
    also the loop and optimizer states that resuming needs. Returns the loaded checkpoint (memory-mapped).

    Raises ``CheckpointError`` naming the file and the problem.
    """
    ckpt = load_checkpoint_weights_only(path)
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"--ckpt_path {path}: not a Lightning checkpoint: the file holds a {type(ckpt).__name__}, not a dict "
            "with 'state_dict' (a Lightning checkpoint is written by Trainer.save_checkpoint or ModelCheckpoint)"
        )
    state = ckpt.get("state_dict")
    if not isinstance(state, dict):
        keys = ", ".join(sorted(map(str, ckpt))[:8]) or "none"
        raise CheckpointError(
            f"--ckpt_path {path}: not a Lightning checkpoint: no 'state_dict' (its keys: {keys}); a plain "
            "model.state_dict() file can be loaded with module.load_state_dict(torch.load(path)) instead"
        )
    if subcommand == "fit":
        missing = [key for key in FIT_KEYS if key not in ckpt]
        if missing:
            raise CheckpointError(
                f"--ckpt_path {path}: cannot resume training from it: it has no {', '.join(missing)} (a weights-only "
                "checkpoint); use it with validate/test/predict, or start a new fit without --ckpt_path"
            )
    return ckpt


def check_state_dict_matches(path: str | Path, checkpoint_shapes: dict[str, Any], module: torch.nn.Module) -> None:
    """Compare a checkpoint's ``state_dict`` (``{key: shape}``) with ``module``'s: missing or unexpected keys (when the
    module loads strictly) and shape mismatches end in one ``CheckpointError`` that names the first few of each."""
    own = module.state_dict()
    strict = bool(getattr(module, "strict_loading", True))
    problems = []
    if strict:
        missing = [k for k in own if k not in checkpoint_shapes]
        unexpected = [k for k in checkpoint_shapes if k not in own]
        if missing:
            problems.append(f"{len(missing)} missing key(s) ({_first(missing)})")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected key(s) ({_first(unexpected)})")
    shapes = []
    for key, shape in checkpoint_shapes.items():
        mine = own.get(key)
        if not isinstance(mine, torch.Tensor) or isinstance(mine, torch.nn.parameter.UninitializedTensorMixin):
            continue
        if tuple(mine.shape) != tuple(shape):
            shapes.append(f"{key}: checkpoint {tuple(shape)} vs model {tuple(mine.shape)}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) ({_first(shapes)})")
    if problems:
        raise CheckpointError(
            f"--ckpt_path {path}: its weights do not fit this recipe's {type(module).__name__}: "
            + "; ".join(problems)
            + ". Is it a checkpoint of another recipe or model configuration?"
        )


def _first(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def check_checkpoint_recipe(path: str | Path, ckpt: dict[str, Any], data_class_path: str | None) -> None:
    """A checkpoint written by another recipe (another data module class) is refused with both names.

    LightningCLI (2.6) rebuilds the model from a checkpoint's ``hyper_parameters`` (``--model`` options and the YAML's
    ``model:`` are overridden by them), so another recipe's checkpoint would otherwise bring its network to this
    recipe's data and fail later, or worse, not at all.
    """
    saved = ckpt.get("datamodule_hyper_parameters")
    saved_path = saved.get("_class_path") if isinstance(saved, dict) else None
    if not saved_path or not data_class_path:
        return
    saved_name, this_name = str(saved_path).rsplit(".", 1)[-1], str(data_class_path).rsplit(".", 1)[-1]
    if saved_name == this_name:
        return
    stamp = ckpt.get(STAMP_KEY)
    experiment = stamp.get("experiment") if isinstance(stamp, dict) else None
    origin = f" (experiment {experiment!r})" if experiment else ""
    raise CheckpointError(
        f"--ckpt_path {path}: it was trained on {saved_name}{origin}, but this recipe's data is {this_name}: a "
        "checkpoint of another recipe? Use it with the recipe that wrote it"
    )
