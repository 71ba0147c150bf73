"""``RecipesCLI``: the LightningCLI of one ``recipes fit|validate|test|predict`` run, with loopwise's defaults.

``recipes fit -c configs/spiral_mlp.yaml`` trains a recipe; ``validate``, ``test`` and ``predict`` evaluate a
checkpoint (``--ckpt_path best|last|<file>|mlflow:<run id>/best|mlflow:<run id>/last``). Every run is tracked in
MLflow (``./mlflow.db`` by default).

``recipes fit --ckpt_path ...`` resumes training and continues the MLflow run stamped in the checkpoint (the run
goes back to RUNNING and ends FINISHED; params changed since the first start are kept as ``loopwise.resumed.<param>``
tags). ``validate``/``test``/``predict`` always make their own run.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import datamodules  # noqa: F401  (registers the data modules for short class names)
import lightning_modules  # noqa: F401  (registers the tasks for short class names)
from datamodules.recipe_contract import new_data_settings_of, predicts_new_data, settings_outside_split
from lightning_modules.recipe_contract import log_train_loss_on, monitor_mode_of, monitor_of
from recipes.compat.internals import (
    ConfigDumpWithInitArgs, SubcommandErrorHook, keep_hyperparameters_from_loggers, mlflow_logger_run_created,
    skip_batch_hooks,
)
from lightning_modules.no_op_profiler import NoOpProfiler
from recipes.doctor.loop_doctor import LoopDoctor
from recipes.doctor.read_steps import is_read_step
from recipes.checkpoints.files import CheckpointError, CheckpointSummary, check_state_dict_matches, inspect_checkpoint
from recipes.checkpoints.atomic_io import with_atomic_checkpoint_io
from recipes.checkpoints.locations import UNTRAINED, evaluates_as_built, resolve_checkpoint
from recipes.checkpoints.history_rank import command_metric
from recipes.run.data_sizes import SIZE_LINKS, DataSizeError, DataSizes, class_at, data_size_error
from recipes.run.processor_match import warn_if_processor_differs
from recipes.run.device_settings import DeviceSettingError, apply_device_settings
from recipes.tracking.evaluation_link import link_evaluation_run
from recipes.run.initial_weights import load_task_initial_weights
from recipes.run.callback_table import RecipeRun, recipe_callbacks
from recipes.run.options import add_recipe_options
from recipes.run.trainer import RecipeTrainer
from recipes.checkpoints.run_stamp import RESUMED_FROM_TAG as BRANCHED, continue_stamped_run
from recipes.run.description import describe_command
from recipes.checkpoints.run_lock import RunLocked, hold_run_lock
from recipes.callbacks.run_record import RunRecord
from recipes.checkpoints.data_guard import ALLOW_TAG, DataChange, DataSettingsChanged, guard_data_settings
from recipes.checkpoints.settings_from_checkpoint import notice_lines, task_values_replaced
from recipes.tracking.uris import TrackingServerUnreachable
from recipes.tracking.logger import RecipeLogger
from recipes.tracking.run_creation import is_store_error, run_creation_refusal
from recipes.run.learning_rate_check import check_learning_rate_args, check_learning_rates
from recipes.run.trainer_settings import check_trainer_settings
from recipes.run.slurm import job_tags, requeued_checkpoint, with_requeue_off
from recipes.tracking.config import (
    RECIPE_LOGGER_CLASS_PATH,
    configure_tracking,
    experiment_name,
    is_tracked,
    prepare_tracking,
    recipe_logger_config,
    start_tracked_run,
    tracking_before_build,
    tracking_uri,
)

from recipes.run.errors import INPUT_ERRORS, RecipeInputError, concise_error
from recipes.run.lightning_noise import quiet_lightning
from recipes.tracking.warning_lines import one_line_warnings


def data_init_args(cfg: Namespace) -> dict[str, Any]:
    """The data module's ``init_args`` of a parsed config, as a plain dict."""
    data = cfg.get("data")
    init_args = data.get("init_args") if isinstance(data, Namespace) else None
    return init_args.as_dict() if isinstance(init_args, Namespace) else {}


def init_from_of(cfg: Namespace) -> Any:
    """The model's ``init_from`` (its initial weights) in a parsed config, ``None`` when it has none."""
    model = cfg.get("model")
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    return init_args.get("init_from") if isinstance(init_args, Namespace) else None


def loop_started(trainer: Trainer) -> bool:
    """Whether any loop of ``trainer`` has started processing a batch."""
    progresses = [
        trainer.fit_loop.epoch_loop.batch_progress,
        trainer.validate_loop.batch_progress,
        trainer.test_loop.batch_progress,
        trainer.predict_loop.batch_progress,
    ]
    return any(p.total.started > 0 for p in progresses)


class RecipesCLI(ConfigDumpWithInitArgs, SubcommandErrorHook, LightningCLI):
    """LightningCLI with MLflow tracking, per-run checkpoints and the loop's defaults switched on.

    In order: parse (``add_arguments_to_parser``), check (``parse_arguments``: tracking, ``--ckpt_path``), build
    (``before_instantiate_classes``: tracking store, devices; ``instantiate_trainer``: the checkpoint's weights
    against the model, the recipe's callbacks, atomic checkpoint writes, the run's tags), run the subcommand.
    Each step asks the module that owns that part of the config (``tracking_config``, ``checkpoint_files``,
    ``checkpoint_locations``, ``run_continuity``, ``device_settings``, ``recipe_callbacks``).
    """

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        # Lightning's notes a recipe user cannot act on (torch's LeafSpec deprecation that Lightning 2.6 raises every
        # step, the fit-time callbacks an evaluation lacks, its tips), by the Lightning module that prints them;
        # loopwise's own warnings as one `recipes: warning:` line (set by each command: warning filters added at import
        # are lost when a `warnings.catch_warnings` block around that import ends, as pytest's around each test)
        quiet_lightning()
        one_line_warnings()
        self.checkpoint: CheckpointSummary | None = None  # the checked --ckpt_path, once parsed
        self.ckpt_path_given: str | None = None  # --ckpt_path as the user gave it (best, last, mlflow:..., a file)
        self.data_changes: list[DataChange] = []  # evaluation on other data settings, allowed by the user
        self.model_as_given: Namespace | None = None  # the task's config before the checkpoint's replaced it
        self.data_sizes = DataSizes()  # the network's sizes, linked from the data module
        self.command_args = sys.argv[1:] if args is None else list(args)  # described in the run (run_description)
        super().__init__(
            model_class=None,
            datamodule_class=None,
            trainer_class=RecipeTrainer,  # its methods' docstrings: loopwise's --ckpt_path help
            save_config_callback=RunRecord,
            save_config_kwargs={"save_to_log_dir": False, "overwrite": True},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    # --- parse ----------------------------------------------------------------------------------------------
    def subcommands(self) -> dict[str, set[str]]:  # type: ignore[override]  # Lightning's is a staticmethod
        """LightningCLI's four subcommands, or only the one the command line starts with (``recipes fit ...``): each
        subcommand's parser is built from the trainer's, model's and data module's signatures, a tenth of a second
        apiece, and a command runs one. ``recipes --help`` and a command line that starts otherwise get all four."""
        every = LightningCLI.subcommands()
        first = self.command_args[0] if self.command_args else None
        return {first: every[first]} if first in every else every

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"trainer.logger": {"class_path": RECIPE_LOGGER_CLASS_PATH}})
        self.data_sizes.add_links(parser)
        # the loop doctor's checks, each switchable from YAML (loop_doctor: {data_wait: false}) or the command line
        parser.add_class_arguments(LoopDoctor, "loop_doctor", instantiate=False)
        add_recipe_options(parser)

    # --- check ----------------------------------------------------------------------------------------------
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        try:  # before jsonargparse, which reads `lr nan` as text and answers with a block about import paths
            check_learning_rate_args(self.command_args)
        except ValueError as err:
            raise RecipeInputError(str(err)) from None
        super().parse_arguments(parser, args)
        cfg = self.subcommand_config
        if cfg is None:
            return
        try:
            check_trainer_settings(cfg, self.config.get("subcommand"))
            check_learning_rates(cfg)
            self.apply_to_config(cfg, configure_tracking(cfg))
            as_built = evaluates_as_built(str(self.config.get("subcommand")), cfg.get("ckpt_path"), init_from_of(cfg))
        except (TrackingServerUnreachable, ValueError) as err:
            raise RecipeInputError(str(err)) from None
        if as_built:  # --ckpt_path none: the network as built, on purpose; the run's tag loopwise.ckpt_path_given
            self.ckpt_path_given = UNTRAINED
            self.apply_to_config(cfg, {"ckpt_path": None})
        elif self.config.get("subcommand") == "fit" and not cfg.get("ckpt_path") and self.resumes_requeued_job():
            requeued = requeued_checkpoint(tracking_uri(cfg), experiment_name(cfg), str(cfg.checkpoints_dir))
            if requeued is not None:
                self.apply_to_config(cfg, {"ckpt_path": requeued})
        if cfg.get("ckpt_path"):
            self.ckpt_path_given = str(cfg.ckpt_path)
            self.checkpoint = self.check_checkpoint(cfg)
            # the file: LightningCLI reads its hyperparameters next (_parse_ckpt_path) and passes it to the trainer;
            # what the user typed is the run's tag loopwise.ckpt_path_given
            self.apply_to_config(cfg, {"ckpt_path": self.checkpoint.path})
            self.model_as_given = cfg.get("model").clone() if isinstance(cfg.get("model"), Namespace) else None
            self.data_changes = self.check_data_settings(cfg, self.checkpoint)
            logger = recipe_logger_config(cfg)
            if self.config.get("subcommand") == "fit" and logger is not None:
                stamp, path = self.checkpoint.stamp, self.checkpoint.path
                continued = continue_stamped_run(logger, stamp, path, tracking_uri(cfg), cfg.get("checkpoints_dir"),
                                                 new_run=self.resumes_in_new_run())
                self.apply_to_config(logger, continued)
                self.lock_resumed_run(cfg)

    @staticmethod
    def apply_to_config(config: Namespace, changes: Mapping[str, Any]) -> None:
        """The one place that changes a parsed config: ``changes`` (``{dotted key: value}``, relative to ``config``)
        as the modules that own those parts return them (``tracking.config.ConfigChanges``)."""
        for key, value in changes.items():
            config[key] = value

    def lock_resumed_run(self, cfg: Namespace) -> None:
        """A resumed run is resumed by one process at a time (rank 0 holds the lock for its DDP group)."""
        logger = recipe_logger_config(cfg)
        # a branch (a new run from an older checkpoint) holds its source run's lock: not while that run trains
        run_id = logger and (logger.get("init_args.run_id") or (logger.get("init_args.tags") or {}).get(BRANCHED))
        if not run_id or rank_zero_only.rank != 0:
            return
        try:
            hold_run_lock(Path(cfg.checkpoints_dir) / experiment_name(cfg), str(run_id))
        except RunLocked as err:
            raise RecipeInputError(str(err)) from None

    def check_checkpoint(self, cfg: Namespace) -> CheckpointSummary:
        """``--ckpt_path`` resolved (``best``/``last`` among the tracked fit runs on this data, ``run:``,
        ``mlflow:``, a file) and read once, weights only (an unsafe pickle is refused, never run), before any run is
        made and before LightningCLI parses its hyperparameters into the config (``_parse_ckpt_path``, right after
        this method): the class paths they name must be the config's (compared as text, nothing imported); its
        weights are compared with the model once that is built (``instantiate_trainer``)."""
        data_now = None
        if not cfg.get("allow_data_change"):  # the data class's own loader and new-data settings never choose rows
            outside = settings_outside_split(class_at(cfg, "data"))
            data_now = {k: v for k, v in data_init_args(cfg).items() if k not in outside}
        # `best` ranks by this command's metric: its task's monitor after the config and the command line
        metric = command_metric(
            class_at(cfg, "model"), cfg.get("model.init_args.monitor"), cfg.get("model.init_args.monitor_mode")
        )
        try:
            resolved = resolve_checkpoint(
                cfg.ckpt_path, experiment_name(cfg), cfg.checkpoints_dir, tracking_uri(cfg), data_now, metric
            )
            data = cfg.get("data")
            data_class = data.get("class_path") if isinstance(data, Namespace) else None
            return inspect_checkpoint(
                resolved.path, self.config.get("subcommand"), data_class, resolved.loaded, cfg.get("model")
            )
        except (FileNotFoundError, CheckpointError) as err:
            raise RecipeInputError(str(err)) from None

    def check_data_settings(self, cfg: Namespace, checkpoint: CheckpointSummary) -> list[DataChange]:
        """Evaluation on the data settings the checkpoint was trained with, or on others only when allowed."""
        now = data_init_args(cfg)
        stage = str(self.config.get("subcommand"))
        data_class = class_at(cfg, "data")
        if stage == "predict" and any(now.get(name) for name in new_data_settings_of(data_class)):
            return []  # new data (or prompts), encoded with the checkpoint's preprocessing: the split plays no part
        try:
            changes = guard_data_settings(
                checkpoint.path, stage, checkpoint.data_settings, now, bool(cfg.get("allow_data_change")),
                settings_outside_split(data_class), checkpoint.data_content,
            )
        except DataSettingsChanged as err:
            raise RecipeInputError(str(err)) from None
        if changes and rank_zero_only.rank == 0:
            print(
                f"recipes: {stage} on other data settings than the checkpoint's, as allowed: "
                + "; ".join(c.tag() for c in changes),
                file=sys.stderr,
            )
        return changes

    @property
    def subcommand_config(self) -> Namespace | None:
        """The parsed config of the chosen subcommand."""
        sub = self.config.get("subcommand")
        return self.config[sub] if sub else None

    # --- build ----------------------------------------------------------------------------------------------
    def before_instantiate_classes(self) -> None:
        cfg = self.subcommand_config
        assert cfg is not None
        if rank_zero_only.rank == 0:  # the task values the checkpoint's hyperparameters replaced, one line each
            linked = frozenset(link.target for link in SIZE_LINKS)
            replaced = task_values_replaced(self.model_as_given, cfg.get("model"), linked)
            for line in notice_lines(replaced, str(self.subcommand)):
                print(line, file=sys.stderr, flush=True)
        self.apply_to_config(cfg, tracking_before_build(cfg))
        prepare_tracking(cfg)
        evaluating = self.subcommand in ("validate", "test", "predict") and self.checkpoint is not None
        self.data_sizes.remember(cfg, self.checkpoint.data_state if evaluating and self.checkpoint else None)
        try:
            apply_device_settings(cfg)
        except DeviceSettingError as err:
            raise RecipeInputError(str(err)) from None

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except INPUT_ERRORS as err:
            size_error = data_size_error(err)
            if isinstance(size_error, DataSizeError):
                raise RecipeInputError(str(size_error)) from err
            raise RecipeInputError(concise_error(size_error or err)) from err
        self.data_sizes.prune_hyperparameters(self.model)
        keep_hyperparameters_from_loggers(self.model)  # the run's config is logged whole (TrackedRun.log_params_once)
        log_train_loss_on(self.model, is_read_step)  # train/loss where the recipe reads it: not every 1.5 ms step
        if self.subcommand == "fit":  # a processor other than the pretrained network's: one warning line
            warn_if_processor_differs(self.model, self.datamodule)
        cfg = self.subcommand_config
        if cfg is not None and not cfg.get("ckpt_path"):  # a restored checkpoint brings its own weights
            try:
                load_task_initial_weights(self.model, experiment_name(cfg), cfg.checkpoints_dir, tracking_uri(cfg))
            except INPUT_ERRORS as err:
                raise RecipeInputError(str(err)) from None

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        cfg = self.subcommand_config
        assert cfg is not None
        if self.checkpoint is not None:
            # before the trainer (and the MLflow run a resumed fit reopens): the wrong recipe's checkpoint is an input
            # error, not Lightning's long RuntimeError from load_state_dict
            check_state_dict_matches(self.checkpoint.path, self.checkpoint.shapes, self.model)
        if self.subcommand == "predict" and predicts_new_data(self.datamodule):
            try:  # the file to predict is read now: a bad one is an error before the run is made
                self.datamodule.check_new_data()
            except INPUT_ERRORS as err:
                raise RecipeInputError(concise_error(err)) from err
        self.trainer_defaults["callbacks"] = self.default_callbacks(cfg)
        if cfg.get("trainer", Namespace()).get("enable_progress_bar") is None and not sys.stdout.isatty():
            kwargs.setdefault("enable_progress_bar", False)
        config_init = self.config_init[self.subcommand] if self.subcommand else self.config_init
        built = config_init.get("trainer", {})
        plugins = with_requeue_off(with_atomic_checkpoint_io(built.get("plugins"), built.get("strategy")))
        if plugins is not None:
            kwargs.setdefault("plugins", plugins)
        if built.get("profiler") is None and not built.get("barebones"):  # a barebones Trainer refuses any profiler
            kwargs.setdefault("profiler", NoOpProfiler())  # Lightning's default records nothing; this costs nothing too
        given = built.get("callbacks") or []  # the user's (Lightning adds the others to this same list)
        given = list(given) if isinstance(given, list) else [given]
        trainer = super().instantiate_trainer(**kwargs)
        for callback in trainer.callbacks:  # the recipe's and Lightning's own: their no-op batch hooks are skipped
            if not any(callback is user for user in given):
                skip_batch_hooks(callback)
        extra = {ALLOW_TAG: "; ".join(c.tag() for c in self.data_changes)} if self.data_changes else {}
        if not (self.subcommand == "fit" and cfg.get("ckpt_path")):  # a resumed run keeps its first description
            extra.update(describe_command(str(self.subcommand), self.command_args))
        extra.update(job_tags())  # under SLURM: the job, which a requeued job resumes by
        extra.update(self.extra_run_tags())  # a subclass's (a sweep's trial: nested under the sweep's parent run)
        start_tracked_run(trainer, cfg, self.subcommand, extra or None, self.ckpt_path_given)
        if self.subcommand != "fit" and self.checkpoint is not None:  # which training run this evaluates
            link_evaluation_run(trainer, self.checkpoint.stamp, tracking_uri(cfg))
        return trainer

    def default_callbacks(self, cfg: Namespace) -> list[Callback]:
        """Callbacks every recipe gets, in the order of ``recipes.run.callback_table.RECIPE_CALLBACKS``, and this
        command's ``extra_callbacks()`` with the grouped ones."""
        return recipe_callbacks(self.recipe_run(cfg), self.extra_callbacks())

    # --- extension points: a command that runs recipes its own way (``recipes sweep``'s ``TrialCLI``) ------------
    def extra_run_tags(self) -> dict[str, str]:
        """Tags this command adds to the run's MLflow tags when the trainer starts the run (``self.subcommand`` is
        set). None here; a subclass overrides it (a sweep's trial: its study, number, params and parent run)."""
        return {}

    def resumes_requeued_job(self) -> bool:
        """Whether a ``fit`` without ``--ckpt_path`` in a requeued SLURM job resumes the run that job's signal stopped
        (``recipes.run.slurm.requeued_checkpoint``). Yes here; a sweep's trial starts its own run."""
        return True

    def resumes_in_new_run(self) -> bool:
        """Whether a ``fit --ckpt_path`` trains on in a new run linked to the checkpoint's (its history before the
        checkpoint's step copied; ``recipes.checkpoints.run_stamp``) rather than continue that run. No here (a resume
        is the same run); a sweep's retry of a killed trial is a run of its own."""
        return False

    def extra_callbacks(self) -> list[Callback]:
        """Callbacks this command adds to the recipe's table when the trainer is built (``self.subcommand`` is set);
        they join the ``CallbackGroup`` after the table's grouped rows, so they keep no checkpoint state. None here;
        a subclass overrides it (a sweep's trial: its pruning callback)."""
        return []

    def recipe_run(self, cfg: Namespace) -> RecipeRun:
        """What this run's callbacks are built from."""
        return RecipeRun(
            stage=self.subcommand,
            experiment=experiment_name(cfg),
            checkpoints_dir=cfg.checkpoints_dir,
            monitor=monitor_of(self.model),
            monitor_mode=monitor_mode_of(self.model),
            tracked=is_tracked(cfg),
            early_stopping_patience=cfg.get("early_stopping_patience"),
            predictions_path=cfg.get("predictions_path"),
            loop_doctor=cfg.loop_doctor.as_dict() if self.subcommand == "fit" else None,
            interactive=sys.stdout.isatty(),
            mlflow_model=bool(cfg.get("mlflow_model", True)),
            register_model=cfg.get("register_model"),
            system_metrics_interval=float(cfg.get("system_metrics_interval") or 0.0),
            checkpoint_every_n_steps=cfg.get("checkpoint_every_n_steps"),
            resumed_from=self.ckpt_path_given if self.subcommand == "fit" else None,
            data_changes_allowed=bool(self.data_changes),
        )

    # --- run --------------------------------------------------------------------------------------------------
    def on_subcommand_error(self, subcommand: str, error: Exception) -> None:
        """A config, data or checkpoint error before any loop started is an input error (one line, exit 2); so is a
        tracking store that refuses to create the run (``recipes.tracking.run_creation``: nothing was trained)."""
        if isinstance(error, INPUT_ERRORS) and not loop_started(self.trainer):
            raise RecipeInputError(concise_error(error)) from error
        logger = self.trainer.logger if self.trainer is not None else None
        if isinstance(logger, RecipeLogger) and not mlflow_logger_run_created(logger) and is_store_error(error):
            raise RecipeInputError(run_creation_refusal(tracking_uri(self.subcommand_config), error)) from None
        raise error
