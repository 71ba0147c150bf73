"""The ``recipes`` command: LightningCLI with loopwise's defaults.

``recipes fit -c configs/spiral_mlp.yaml`` trains a recipe; ``validate``, ``test`` and ``predict`` evaluate a
checkpoint (``--ckpt_path best|last|<file>|mlflow:<run id>/best|mlflow:<run id>/last``). Every run is tracked in
MLflow (``./mlflow.db`` by default).

``recipes fit --ckpt_path ...`` resumes training and continues the MLflow run stamped in the checkpoint (the run
goes back to RUNNING and ends FINISHED; params changed since the first start are kept as ``loopwise.resumed.<param>``
tags). ``validate``/``test``/``predict`` always make their own run.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import torch
from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback, EarlyStopping, LearningRateMonitor
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import datamodules  # noqa: F401  (registers the data modules for short class names)
import lightning_modules  # noqa: F401  (registers the tasks for short class names)
from lightning_modules.compat import SubcommandErrorHook, strategy_checkpoint_io_is_set
from recipes.callbacks import LoopDoctor, TrainingPlan
from recipes.checkpoint_io import AtomicCheckpointIO
from recipes.checkpoints import (
    CheckpointError,
    RunCheckpoint,
    RunContinuity,
    check_checkpoint,
    check_checkpoint_recipe,
    check_state_dict_matches,
    read_run_stamp,
    resolve_checkpoint,
)
from recipes.confusion_matrix import ConfusionMatrixArtifact
from recipes.plateau_resume import PlateauStepOnResume
from recipes.predictions import PredictionCsvWriter
from recipes.progress import EpochSummary
from recipes.random_state import RandomStates
from recipes.run_record import RunRecord
from recipes.sqlite_store import prepare_sqlite_store
from recipes.tracking import RecipeLogger, TrackingServerUnreachable, check_tracking_server, default_tracking_uri

DEFAULT_EXPERIMENT = "loopwise"
# torch 2.13 deprecates an API that Lightning 2.6 calls on every step; the warning says nothing to a recipe user
warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\).*")
# evaluation runs restore weights only; the fit-time checkpoint callbacks they lack are irrelevant there
warnings.filterwarnings("ignore", message="Be aware that when using `ckpt_path`, callbacks used to create")
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, MisconfigurationException)  # CheckpointError is a ValueError


class RecipeInputError(Exception):
    """A config, data or checkpoint problem found before the training loop started."""


def git_commit(cwd: Path) -> str | None:
    """HEAD of the git repository containing ``cwd``, if any."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def concise_error(err: BaseException) -> str:
    """One readable message: jsonargparse's Union report cut down to the errors that are not 'not None'."""
    text = str(err)
    if "Does not validate against any of the Union subtypes" in text:
        reasons = [
            line.strip()[2:]
            for line in text.splitlines()
            if line.strip().startswith("- ") and "NoneType" not in line
        ]
        if reasons:
            return "; ".join(reasons)
    return f"{type(err).__name__}: {text}"


def loop_started(trainer: Trainer) -> bool:
    """Whether any loop of ``trainer`` has started processing a batch."""
    progresses = [
        trainer.fit_loop.epoch_loop.batch_progress,
        trainer.validate_loop.batch_progress,
        trainer.test_loop.batch_progress,
        trainer.predict_loop.batch_progress,
    ]
    return any(p.total.started > 0 for p in progresses)


class RecipesCLI(SubcommandErrorHook, LightningCLI):
    """LightningCLI with MLflow tracking, per-run checkpoints and the loop's defaults switched on."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            model_class=None,
            datamodule_class=None,
            save_config_callback=RunRecord,
            save_config_kwargs={"save_to_log_dir": False, "overwrite": True},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    # --- parser ---------------------------------------------------------------------------------------------
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"trainer.logger": {"class_path": "recipes.tracking.RecipeLogger"}})
        # the loop doctor's checks, each switchable from YAML (loop_doctor: {data_wait: false}) or the command line
        parser.add_class_arguments(LoopDoctor, "loop_doctor", instantiate=False)
        parser.add_argument(
            "--early_stopping_patience",
            type=int | None,
            default=None,
            help="Stop training when the task's monitored metric has not improved for this many validations.",
        )
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"] | None,
            default=None,
            help="torch.set_float32_matmul_precision for runs on CUDA ('high': TF32 tensor cores for float32 "
            "matmuls; set by configs/trainer/gpu-*.yaml). Ignored on CPU.",
        )
        parser.add_argument(
            "--checkpoints_dir",
            type=str,
            default="checkpoints",
            help="Root directory of checkpoints: <checkpoints_dir>/<experiment>/<run id>/{best,last}.ckpt.",
        )
        parser.add_argument(
            "--predictions_path",
            type=str | None,
            default=None,
            help="CSV file for `recipes predict` (default predictions/<experiment>-<time>.csv).",
        )

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        super().parse_arguments(parser, args)
        cfg = self.subcommand_config
        if cfg is None:
            return
        recipe = self.recipe_name(cfg)
        logger = cfg.get("trainer", Namespace()).get("logger")
        if isinstance(logger, Namespace) and logger.get("class_path", "").endswith("RecipeLogger"):
            if not logger.get("init_args.experiment_name"):
                logger["init_args.experiment_name"] = recipe
            try:  # a tracking server that does not answer stops the recipe now, not at its first log call
                check_tracking_server(self.tracking_uri(cfg))
            except TrackingServerUnreachable as err:
                raise RecipeInputError(str(err)) from None
        if cfg.get("ckpt_path"):
            tracking_uri = self.tracking_uri(cfg)
            try:
                cfg["ckpt_path"] = resolve_checkpoint(
                    cfg.ckpt_path, self.experiment_name(cfg), cfg.checkpoints_dir, tracking_uri
                )
                # a readable Lightning checkpoint (weights only: an unsafe pickle is refused, never run), before any
                # run is made; its weights are compared with the model once that is built (instantiate_trainer)
                ckpt = check_checkpoint(cfg.ckpt_path, self.config.get("subcommand"))
                data = cfg.get("data")
                data_class = data.get("class_path") if isinstance(data, Namespace) else None
                check_checkpoint_recipe(cfg.ckpt_path, ckpt, data_class)
                self.checkpoint_shapes = {k: v.shape for k, v in ckpt["state_dict"].items() if hasattr(v, "shape")}
                del ckpt
            except (FileNotFoundError, CheckpointError) as err:
                raise RecipeInputError(str(err)) from None
            if self.config.get("subcommand") == "fit":
                self.continue_run(cfg, tracking_uri)

    @staticmethod
    def tracking_uri(cfg: Namespace) -> str:
        """The tracking URI the RecipeLogger will use: its ``tracking_uri``, else the default (read now)."""
        logger = cfg.get("trainer", Namespace()).get("logger")
        if isinstance(logger, Namespace):
            uri = logger.get("init_args", Namespace()).get("tracking_uri")
            if uri:
                return str(uri)
        return default_tracking_uri()

    @staticmethod
    def continue_run(cfg: Namespace, tracking_uri: str) -> None:
        """``fit --ckpt_path``: attach the RecipeLogger to the MLflow run stamped in the checkpoint.

        Nothing happens when the checkpoint has no stamp, a run id was given explicitly, the logger is not a
        RecipeLogger, or the run is not in this tracking store (then a new run starts, with a warning).
        """
        logger = cfg.get("trainer", Namespace()).get("logger")
        if not (isinstance(logger, Namespace) and logger.get("class_path", "").endswith("RecipeLogger")):
            return
        if logger.get("init_args", Namespace()).get("run_id"):
            return
        run_id = read_run_stamp(cfg.ckpt_path).get("mlflow_run_id")
        if not run_id:
            return
        from mlflow.exceptions import MlflowException  # noqa: PLC0415
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        try:
            MlflowClient(tracking_uri).get_run(run_id)
        except MlflowException:
            warnings.warn(
                f"checkpoint {cfg.ckpt_path} belongs to MLflow run {run_id}, which is not in {tracking_uri}: "
                "training continues in a new run",
                stacklevel=2,
            )
            return
        logger["init_args.run_id"] = run_id

    @property
    def subcommand_config(self) -> Namespace | None:
        """The parsed config of the chosen subcommand."""
        sub = self.config.get("subcommand")
        return self.config[sub] if sub else None

    @staticmethod
    def recipe_name(cfg: Namespace) -> str:
        """The recipe's file stem: the first ``-c`` file."""
        paths = cfg.get("config") or []
        for path in paths:
            return Path(str(path)).stem
        return DEFAULT_EXPERIMENT

    def experiment_name(self, cfg: Namespace) -> str:
        """MLflow experiment of this run: the logger's experiment_name, else the recipe name."""
        logger = cfg.get("trainer", Namespace()).get("logger")
        if isinstance(logger, Namespace):
            name = logger.get("init_args", Namespace()).get("experiment_name")
            if name:
                return str(name)
        return self.recipe_name(cfg)

    # --- instantiation --------------------------------------------------------------------------------------
    def before_instantiate_classes(self) -> None:
        cfg = self.subcommand_config
        assert cfg is not None
        if cfg.trainer.get("fast_dev_run") and cfg.trainer.get("logger") not in (False, None):
            # Lightning swaps every logger for a dummy under fast_dev_run; not building the MLflow logger saves
            # importing mlflow and opening (or creating) the tracking store, a large share of a smoke run's start-up
            cfg.trainer.logger = False
        logger = cfg.get("trainer", Namespace()).get("logger")
        if isinstance(logger, Namespace) and logger.get("class_path", "").endswith("RecipeLogger"):
            # recipes started at once on one ./mlflow.db: one creates the tables and the experiment, the others wait
            # (before the logger is built: MLflow's client opens, and creates, the database then)
            prepare_sqlite_store(self.tracking_uri(cfg), self.experiment_name(cfg))
        precision = str(cfg.trainer.get("precision"))
        accelerator = str(cfg.trainer.get("accelerator"))
        if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
            raise RecipeInputError(
                f"trainer.accelerator={accelerator!r} (e.g. from configs/trainer/gpu-*.yaml) but torch sees no CUDA "
                "device: leave that -c out, use -c configs/trainer/cpu.yaml, or pass --trainer.accelerator cpu"
            )
        matmul_precision = cfg.get("float32_matmul_precision")
        if matmul_precision and accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
            torch.set_float32_matmul_precision(matmul_precision)
        if precision.startswith("bf16") and accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
            if not torch.cuda.is_bf16_supported():
                raise RecipeInputError(
                    f"precision {precision!r} was requested but {torch.cuda.get_device_name()} has no bf16 support: "
                    "use -c configs/trainer/gpu-fp16.yaml (16-mixed with a GradScaler) instead"
                )

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        cfg = self.subcommand_config
        assert cfg is not None
        if getattr(self, "checkpoint_shapes", None) is not None:
            # before the trainer (and the MLflow run a resumed fit reopens): the wrong recipe's checkpoint is an input
            # error, not Lightning's long RuntimeError from load_state_dict
            check_state_dict_matches(cfg.ckpt_path, self.checkpoint_shapes, self.model)
        self.trainer_defaults["callbacks"] = self.default_callbacks(cfg)
        trainer_cfg = cfg.get("trainer", Namespace())
        if trainer_cfg.get("enable_progress_bar") is None and not sys.stdout.isatty():
            kwargs.setdefault("enable_progress_bar", False)
        plugins = self.plugins_with_atomic_checkpoints()
        if plugins is not None:
            kwargs.setdefault("plugins", plugins)
        trainer = super().instantiate_trainer(**kwargs)
        for logger in trainer.loggers:
            if isinstance(logger, RecipeLogger):
                tags = {"loopwise.recipe": self.recipe_name(cfg), "loopwise.stage": self.subcommand}
                if cfg.get("ckpt_path"):
                    tags["loopwise.ckpt_path"] = cfg.ckpt_path
                commit = git_commit(Path.cwd())
                if commit:
                    tags["loopwise.git_commit"] = commit
                logger.add_tags(tags)
                logger.reopen()
        return trainer

    def plugins_with_atomic_checkpoints(self) -> list[Any] | None:
        """The trainer's plugins plus ``AtomicCheckpointIO``, unless a ``CheckpointIO`` is configured already (in
        ``trainer.plugins`` or on a strategy instance): ``None`` then, and the configured one is used."""
        from lightning.fabric.plugins import CheckpointIO  # noqa: PLC0415
        from lightning.pytorch.strategies import Strategy  # noqa: PLC0415

        instantiated = self._get(self.config_init, "trainer", default={})
        plugins = instantiated.get("plugins")
        plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
        if any(isinstance(p, CheckpointIO) for p in plugins):
            return None
        strategy = instantiated.get("strategy")
        if isinstance(strategy, Strategy) and strategy_checkpoint_io_is_set(strategy):
            return None
        return [*plugins, AtomicCheckpointIO()]

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except INPUT_ERRORS as err:
            raise RecipeInputError(concise_error(err)) from err

    def on_subcommand_error(self, subcommand: str, error: Exception) -> None:
        """A config, data or checkpoint error before any loop started is an input error (one line, exit 2)."""
        if isinstance(error, INPUT_ERRORS) and not loop_started(self.trainer):
            raise RecipeInputError(concise_error(error)) from error
        raise error

    def default_callbacks(self, cfg: Namespace) -> list[Callback]:
        """Callbacks every recipe gets: checkpoints, LR monitor, early stopping, predictions, epoch lines."""
        monitor = getattr(self.model, "monitor", "val/loss")
        mode = getattr(self.model, "monitor_mode", "min")
        experiment = self.experiment_name(cfg)
        callbacks: list[Callback] = []
        if self.subcommand == "fit":
            callbacks.append(TrainingPlan())  # first, so the plan prints before the epoch lines
            callbacks.append(RunContinuity())
            callbacks.append(RandomStates())  # a resumed run draws what an uninterrupted one would
            callbacks.append(PlateauStepOnResume())  # the plateau step Lightning skips on resume
            callbacks.append(RunCheckpoint(cfg.checkpoints_dir, experiment, "best", monitor=monitor, mode=mode))
            callbacks.append(RunCheckpoint(cfg.checkpoints_dir, experiment, "last"))
            if cfg.get("trainer", Namespace()).get("logger") not in (False, None):
                callbacks.append(LearningRateMonitor(logging_interval="step"))
            if cfg.get("early_stopping_patience") is not None:
                callbacks.append(EarlyStopping(monitor=monitor, mode=mode, patience=cfg.early_stopping_patience))
        if self.subcommand in ("fit", "validate", "test"):
            callbacks.append(ConfusionMatrixArtifact())
        if self.subcommand == "predict":
            stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
            path = cfg.get("predictions_path") or f"predictions/{experiment}-{stamp}.csv"
            callbacks.append(PredictionCsvWriter(path))
        if not sys.stdout.isatty():
            callbacks.append(EpochSummary())
        if self.subcommand == "fit":
            # last: its batch timer then counts the other callbacks' batch hooks as compute, not as data wait
            callbacks.append(LoopDoctor(**cfg.loop_doctor.as_dict()))
        return callbacks


def main(args: list[str] | None = None) -> None:
    """Entry point of ``recipes`` and ``python -m recipes``; ``args`` defaults to ``sys.argv[1:]``.

    Config, data and checkpoint problems found before the loop starts end with one ``recipes: error:`` line and
    exit code 2; errors during training keep their traceback. SIGTERM / SIGINT during ``fit`` save ``last.ckpt``,
    mark the MLflow run KILLED and exit 143 / 130. ``recipes compare ...`` compares runs (``recipes.compare``).
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] == ["compare"]:
        from recipes.compare import main as compare_main

        raise SystemExit(compare_main(argv[1:]))
    try:
        RecipesCLI(args=args)
    except RecipeInputError as err:
        print(f"recipes: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except SIGTERMException as stop:  # Lightning raises it without a code, which would exit 0
        code = stop.code if isinstance(stop.code, int) and stop.code else 128 + 15
        name = "SIGINT" if code == 128 + 2 else "SIGTERM"
        if rank_zero_only.rank == 0:  # under DDP every process stops; one says so
            print(f"recipes: stopped by {name} (run marked KILLED, last.ckpt saved)", file=sys.stderr)
        raise SystemExit(code) from None
