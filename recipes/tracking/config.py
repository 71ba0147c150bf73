"""The tracking part of a recipe's config: the ``RecipeLogger`` under ``trainer.logger``, its experiment and store.

``RecipesCLI`` calls these at fixed points: ``configure_tracking`` after parsing (experiment name, a tracking server
that answers), ``tracking_before_build`` and ``prepare_tracking`` before the classes are built (no logger under
``fast_dev_run``; the SQLite store made once), and ``start_tracked_run`` once the trainer exists (run tags, a
continued run reopened). None of them changes the parsed config: those that want it changed return the changes
(``ConfigChanges``), which ``RecipesCLI.apply_to_config`` writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typing import Any

from jsonargparse import Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.tracking.abandoned_runs import close_abandoned_runs, process_tags, unmark_abandoned
from recipes.tracking.database_urls import with_installed_driver
from recipes.tracking.registered_model_name import check_registered_model_name
from recipes.tracking.sqlite_store import prepare_sqlite_store
from recipes.tracking.logger import RecipeLogger, default_tracking_uri
from recipes.tracking.uris import check_tracking_server

DEFAULT_EXPERIMENT = "loopwise"
RECIPE_LOGGER_CLASS_PATH = "recipes.tracking.RecipeLogger"
#: the run's ``--ckpt_path`` as the user gave it (``best``, ``last``, ``mlflow:<run id>/best``, a file); the tag
#: ``loopwise.ckpt_path`` holds the file it resolved to
CKPT_PATH_GIVEN_TAG = "loopwise.ckpt_path_given"

#: changes a module wants in the parsed config of the subcommand: ``{dotted key: new value}`` (e.g.
#: ``{"trainer.logger.init_args.experiment_name": "spiral_mlp"}``), written by ``RecipesCLI.apply_to_config`` only
ConfigChanges = dict[str, Any]


def logger_config(cfg: Namespace) -> object:
    """``trainer.logger`` of a parsed config as it stands (a Namespace, a list, ``True``/``False`` or ``None``)."""
    return cfg.get("trainer", Namespace()).get("logger")


def recipe_logger_config(cfg: Namespace) -> Namespace | None:
    """The ``RecipeLogger`` entry of ``trainer.logger`` (class path ``recipes.tracking.RecipeLogger`` or a name that
    ends in ``RecipeLogger``), or ``None`` when the recipe logs elsewhere or not at all."""
    logger = logger_config(cfg)
    if isinstance(logger, Namespace) and logger.get("class_path", "").endswith("RecipeLogger"):
        return logger
    return None


def recipe_name(cfg: Namespace) -> str:
    """The recipe's file stem: the first ``-c`` file."""
    paths = cfg.get("config") or []
    for path in paths:
        return Path(str(path)).stem
    return DEFAULT_EXPERIMENT


def logger_init_arg(cfg: Namespace, name: str) -> str | None:
    """A non-empty ``trainer.logger.init_args.<name>`` as a string, else ``None``."""
    logger = logger_config(cfg)
    value = logger.get("init_args", Namespace()).get(name) if isinstance(logger, Namespace) else None
    return str(value) if value else None


def tracking_uri(cfg: Namespace) -> str:
    """The tracking URI the logger will use: its ``tracking_uri``, else the default (read now); a database URL names
    the driver installed here (``database_urls.with_installed_driver``)."""
    return with_installed_driver(logger_init_arg(cfg, "tracking_uri") or default_tracking_uri())


def experiment_name(cfg: Namespace) -> str:
    """MLflow experiment of this run: the logger's ``experiment_name``, else the recipe name."""
    return logger_init_arg(cfg, "experiment_name") or recipe_name(cfg)


def configure_tracking(cfg: Namespace) -> ConfigChanges:
    """After parsing: the ``RecipeLogger``'s experiment defaults to the recipe name (the change returned), and a
    tracking server that does not answer stops the recipe now (``TrackingServerUnreachable``), not at its first log
    call."""
    logger = recipe_logger_config(cfg)
    if logger is None:
        return {}
    changes: ConfigChanges = {}
    name = logger.get("init_args.experiment_name")
    if not name:
        name = recipe_name(cfg)
        changes["trainer.logger.init_args.experiment_name"] = name
    check_experiment_name(str(name), cfg.get("checkpoints_dir") or ".")
    check_registered_model_name(cfg.get("register_model"))
    given = logger_init_arg(cfg, "tracking_uri")
    if given and with_installed_driver(given) != given:  # e.g. mysql:// -> mysql+pymysql:// (database_urls.py)
        changes["trainer.logger.init_args.tracking_uri"] = with_installed_driver(given)
    check_tracking_server(tracking_uri(cfg))
    return changes


def check_experiment_name(name: str, checkpoints_dir: str | Path = ".") -> None:
    """An experiment name is a plain name: it is also a folder under ``--checkpoints_dir``, so a path separator or
    ``..`` would put checkpoints outside it, and a name longer than the file system allows would fail once the run
    exists (``File name too long``, the run left RUNNING). Either is a ``ValueError`` before any run is made."""
    if not name.strip() or "/" in name or "\\" in name or ".." in name or name.startswith("."):
        raise ValueError(
            f"the experiment name {name!r} is not a plain name (no '/', '\\', '..' or leading '.'): it names the "
            "folder of the run's checkpoints under --checkpoints_dir; name the recipe file or "
            "--trainer.logger.init_args.experiment_name plainly, e.g. 'churn_v2'"
        )
    limit = longest_experiment_name(checkpoints_dir)
    size = len(name.encode("utf-8"))
    if size > limit:
        shown = name if len(name) <= 40 else f"{name[:40]}..."
        raise ValueError(
            f"the experiment name {shown!r} is {size} bytes long, more than the {limit} this file system allows: it "
            f"names the folder of the run's checkpoints (--checkpoints_dir {checkpoints_dir}) and its predictions "
            f"file (<experiment>{PREDICTIONS_SUFFIX}); name the recipe file or "
            "--trainer.logger.init_args.experiment_name shorter"
        )


#: what follows the experiment name in the longest file name made from it: predictions/<experiment>-<time>.csv
PREDICTIONS_SUFFIX = "-YYYYmmdd-HHMMSS.csv"
#: MLflow's own limit on an experiment name (characters; every character counted here is at least one byte)
MLFLOW_EXPERIMENT_NAME_MAX = 500


def longest_experiment_name(checkpoints_dir: str | Path) -> int:
    """The longest experiment name, in UTF-8 bytes: the file system's longest file name (``NAME_MAX`` where the
    checkpoints will be, 255 when it cannot be asked) less the predictions file's suffix, and within MLflow's 500."""
    folder = Path(checkpoints_dir).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        name_max = int(os.pathconf(folder, "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows) or the file system does not say
        name_max = 255
    return min(name_max - len(PREDICTIONS_SUFFIX), MLFLOW_EXPERIMENT_NAME_MAX)


def tracking_before_build(cfg: Namespace) -> ConfigChanges:
    """Before the classes are built: no logger under ``fast_dev_run`` (the change returned)."""
    if cfg.trainer.get("fast_dev_run") and logger_config(cfg) not in (False, None):
        # Lightning swaps every logger for a dummy under fast_dev_run; not building the MLflow logger saves
        # importing mlflow and opening (or creating) the tracking store, a large share of a smoke run's start-up
        return {"trainer.logger": False}
    return {}


def prepare_tracking(cfg: Namespace) -> None:
    """Before the classes are built, once ``tracking_before_build``'s changes are in ``cfg``: the SQLite store ready
    for the run."""
    if recipe_logger_config(cfg) is not None:
        # recipes started at once on one ./mlflow.db: one creates the tables, the others wait (before the logger is
        # built: MLflow's client opens, and creates, the database then); the experiment is made with the run
        # (RecipeLogger), so a command that fails before then leaves none empty
        prepare_sqlite_store(tracking_uri(cfg), None)
        for run_id in close_abandoned_runs(tracking_uri(cfg), experiment_name(cfg)):
            print(
                f"recipes: run {run_id} was left RUNNING by a process that no longer exists: marked KILLED",
                file=sys.stderr,
            )


def is_tracked(cfg: Namespace) -> bool:
    """Whether the run has a logger at all (``trainer.logger`` not ``false``/``null``)."""
    return logger_config(cfg) not in (False, None)


def git_commit(cwd: Path) -> str | None:
    """HEAD of the git repository containing ``cwd``, if any."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def start_tracked_run(
    trainer: Trainer,
    cfg: Namespace,
    stage: str,
    extra_tags: dict[str, str] | None = None,
    ckpt_path_given: str | None = None,
) -> None:
    """Once the trainer exists: tag the run (recipe, stage, checkpoint: the file and ``ckpt_path_given``, what the
    user typed, git commit, ``extra_tags``) and reopen a continued run."""
    for logger in trainer.loggers:
        if isinstance(logger, RecipeLogger):
            tags = {
                "loopwise.recipe": recipe_name(cfg),
                "loopwise.stage": stage,
                **process_tags(),
                **(extra_tags or {}),
            }
            if cfg.get("ckpt_path"):
                tags["loopwise.ckpt_path"] = cfg.ckpt_path
            if ckpt_path_given:  # also ``none``: an evaluation of the network as built, on purpose
                tags[CKPT_PATH_GIVEN_TAG] = str(ckpt_path_given)
            commit = git_commit(Path.cwd())
            if commit:
                tags["loopwise.git_commit"] = commit
            if stage == "fit":  # the record is also kept next to the checkpoints (recipes/tracking/journal.py)
                logger.keep_journal(Path(cfg.checkpoints_dir) / experiment_name(cfg))
            logger.add_tags(tags)
            logger.reopen()
            if logger.resumed and rank_zero_only.rank == 0:  # it goes on: no longer abandoned (its journal replayed)
                unmark_abandoned(tracking_uri(cfg), str(logger.run_id))
