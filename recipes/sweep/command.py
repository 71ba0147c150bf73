"""``recipes sweep``: a hyperparameter search on Optuna where every trial is a full ``recipes fit``.

    recipes sweep -c configs/spiral_mlp.yaml -c configs/sweeps/spiral_mlp.yaml --n_trials 20
    recipes sweep ... --study_name spiral-lr --storage postgresql://user:pw@db/optuna   # one study, many machines
    # (a PostgreSQL or MySQL storage needs its driver: pip install 'loopwise[postgres]' or 'loopwise[mysql]')

The ``-c`` file with a ``sweep:`` section is the search space (``recipes.sweep.space``); every other argument goes
to each trial's ``recipes fit`` unchanged, followed by the trial's sampled values. The objective is the best value
of the task's monitored metric over the trial's validations (``--metric``/``--direction`` or the sweep file
choose another); the sampler is Optuna's TPE, seeded from ``seed_everything`` and the trial number (the same
command samples the same values; several workers sample different ones); the pruner (median by default) stops a
trial whose validations fall behind. ``--n_trials`` counts the study's COMPLETE trials, so running the command
again, or in several processes or machines on one ``--storage``, adds trials to the same study until it has that
many complete ones. A trial whose worker died (``kill -9``, a lost machine) is failed once its heartbeats stop and
retried with the same values (``recipes.sweep.heartbeat``).

In MLflow the sweep is one parent run (``loopwise.stage`` sweep: its settings, the search space, the best value
and params, trial counts, parameter importances, ``best.yaml``) and every trial a child run with the complete
record of a recipe fit. ``best.yaml``, the best trial's complete config, lands beside the study: ``recipes fit -c
best.yaml`` trains the best trial again.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from typing import Literal

from jsonargparse import ArgumentError, ArgumentParser, Namespace

PROG = "recipes sweep"


class SweepError(Exception):
    """A sweep that cannot start: one ``recipes sweep: error:`` line, exit code 2."""


def sweep_options(  # noqa: PLR0913 - the command's options, read from this signature and docstring
    n_trials: int = 20,
    timeout: float | None = None,
    study_name: str | None = None,
    storage: str | None = None,
    metric: str | None = None,
    direction: Literal["minimize", "maximize"] | None = None,
    pruner: Literal["median", "percentile", "hyperband", "none"] | None = None,
    heartbeat_interval: int = 10,
) -> None:
    """A hyperparameter search on Optuna where every trial is a full recipes fit: the -c file with a 'sweep:'
    section is the search space, every other -c file and every argument that is none of these options goes to each
    trial's recipes fit unchanged.

    Args:
        n_trials: COMPLETE trials of the study in all (running the command again, or on several machines on one
            --storage, adds trials to the same study until it has that many; pruned, failed and interrupted trials
            do not count; the sweep stops early once as many trials failed, when none of the first n_trials
            completed, or after 10 x n_trials finished ones)
        timeout: stop starting trials after this many seconds
        study_name: the Optuna study (default: <experiment>-sweep)
        storage: Optuna storage URL (default: sqlite:///./optuna.db; postgresql://user:pw@host/db with
            loopwise[postgres], mysql://... with loopwise[mysql])
        metric: objective (default: the sweep file's, else the task's monitor)
        direction: the objective's better way (default: the sweep file's, else the monitor's mode)
        pruner: stops a trial whose validations fall behind (default: the sweep file's, else median)
        heartbeat_interval: seconds between a running trial's heartbeats in the study's database; a trial without
            one for 3 intervals is taken for dead (its worker was killed, on any machine), failed and retried with
            the same values (0: no heartbeats)
    """


#: the options of the sweep itself, each taking one value; every other argument is the trials'
OWN_OPTIONS = frozenset({"-c", "--config", *(f"--{name}" for name in inspect.signature(sweep_options).parameters)})


def build_parser() -> ArgumentParser:
    """The options of ``recipes sweep``: the ``-c`` files and ``sweep_options``; a bad one raises ``ArgumentError``."""
    parser = ArgumentParser(prog=PROG, description=sweep_options.__doc__.split("\n\n")[0], exit_on_error=False)
    parser.add_argument("-c", "--config", action="append", default=[], metavar="FILE",
                        help="a recipe config (passed to every trial) or the sweep file (a 'sweep:' section)")
    parser.add_function_arguments(sweep_options, as_group=False)
    return parser


def own_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the sweep's own options with their values, in order; every other argument, in order)."""
    own: list[str] = []
    rest: list[str] = []
    arguments = iter(argv)
    for arg in arguments:
        name = arg.split("=", 1)[0]
        if arg in ("-h", "--help") or name in OWN_OPTIONS:
            own.append(arg)
            value = next(arguments, None) if name in OWN_OPTIONS and "=" not in arg else None
            if value is not None:  # (an option last, without its value: jsonargparse says so)
                own.append(value)
        else:
            rest.append(arg)
    return own, rest


def split_arguments(argv: list[str]) -> tuple[Namespace, list[str], str]:
    """(sweep options, the arguments of every trial's ``recipes fit``, the sweep file)."""
    from recipes.sweep.space import is_sweep_file  # noqa: PLC0415

    own, rest = own_arguments(argv)
    try:
        options = build_parser().parse_args(own)
    except ArgumentError as err:  # jsonargparse's lines, as one
        reason = " ".join(line.strip() for line in str(err).splitlines())
        raise SweepError(f"{reason} (recipes sweep --help)") from None
    sweep_files = [c for c in options.config if is_sweep_file(c)]
    configs = [c for c in options.config if c not in sweep_files]
    if len(sweep_files) != 1:
        found = f"got {len(sweep_files)}: {sweep_files}" if sweep_files else "none of the -c files has a 'sweep:' section"
        raise SweepError(f"name exactly one sweep file (-c configs/sweeps/<recipe>.yaml); {found}")
    if not configs:
        raise SweepError("name the recipe: -c configs/<recipe>.yaml before the sweep file")
    if options.n_trials < 1:
        raise SweepError(f"--n_trials must be >= 1, got {options.n_trials}")
    if options.heartbeat_interval < 0:
        raise SweepError(f"--heartbeat_interval must be >= 0 seconds (0: none), got {options.heartbeat_interval}")
    fit_args = [a for c in configs for a in ("-c", c)] + ["--mlflow_model=false"] + rest
    return options, fit_args, sweep_files[0]


def parsed_fit_config(fit_args: list[str]) -> Namespace:
    """The config every trial starts from, parsed as ``recipes fit`` parses it (nothing built or tracked)."""
    from recipes.run.errors import RecipeInputError  # noqa: PLC0415
    from recipes.run.recipes_cli import RecipesCLI  # noqa: PLC0415

    class Parsed(Exception):  # noqa: N818 - a signal, not an error
        def __init__(self, config: Namespace) -> None:
            self.config = config

    class ParseOnly(RecipesCLI):
        def before_instantiate_classes(self) -> None:
            raise Parsed(self.config[self.subcommand])

    try:
        ParseOnly(args=["fit", *fit_args])
    except Parsed as parsed:
        return parsed.config
    except RecipeInputError as err:
        raise SweepError(str(err)) from None
    except SystemExit as err:  # jsonargparse's own error message is printed already
        raise SweepError("the recipe's arguments do not parse (see above)") from err
    raise SweepError("the recipe's arguments do not parse")


def check_tracked(cfg: Namespace) -> None:
    """A sweep records its trials in MLflow: the recipe must log with ``RecipeLogger``."""
    from recipes.tracking.config import recipe_logger_config  # noqa: PLC0415

    if recipe_logger_config(cfg) is None:
        raise SweepError("a sweep tracks its trials in MLflow: keep the recipe's trainer.logger (RecipeLogger) on")


def check_one_task() -> None:
    """A sweep worker is one process: ``srun`` with several tasks would start a worker per task, each sampling its
    own trial, and DDP between them would train two trials' values as one model (or wait forever for a process that
    ended). A ``SweepError`` names the fix, before anything else."""
    from recipes.run.slurm import step_tasks  # noqa: PLC0415

    tasks = step_tasks()
    if tasks > 1:
        raise SweepError(
            f"this SLURM job step runs {tasks} tasks (SLURM_NTASKS={tasks}): each would be a sweep worker with a "
            "trial of its own, and DDP between them would train different trials' values as one model; run one "
            "task per sweep worker with one device (#SBATCH --ntasks-per-node=1; a job array for several workers: "
            "docs/how-to/slurm.md)"
        )


def usable_storage(storage: str | None) -> str | None:
    """``--storage`` as Optuna will open it: a PostgreSQL or MySQL URL naming the driver installed here, checked to
    answer now (``recipes.tracking.database_urls``); a missing driver, a database that does not answer or a refused
    login is a ``SweepError`` (its password masked), before any trial."""
    from recipes.tracking.database_urls import DatabaseUnavailable, usable_database_url  # noqa: PLC0415

    if storage is None:
        return None
    try:
        return usable_database_url(storage, "sweep storage (--storage)")
    except DatabaseUnavailable as err:
        raise SweepError(str(err)) from None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``recipes sweep ...`` (``argv``: the arguments after ``sweep``); the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:  # --help and a bad option before Lightning, Optuna and SQLAlchemy are imported
        options, fit_args, sweep_path = split_arguments(argv)
    except (SweepError, ValueError) as err:  # ValueError: a -c file that cannot be read (SweepSpaceError)
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: PLC0415
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415

    from recipes.sweep.processes import follow, is_follower  # noqa: PLC0415
    from recipes.callbacks.stop_on_signal import SIGNAL_EXIT_CODES  # noqa: PLC0415
    from recipes.run.slurm import requeue_signal_stops  # noqa: PLC0415
    from recipes.sweep.runner import run_sweep  # noqa: PLC0415
    from recipes.sweep.space import SweepSpaceError, as_cli_value, read_sweep_file  # noqa: PLC0415

    # every trial (and the parse of the recipe below) hands LightningCLI its arguments on purpose; its warning about
    # that repeated the whole command line, --storage password included, before each
    warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended", category=UserWarning)
    try:
        check_one_task()
        if not is_follower():  # a DDP follower never opens the study
            options.storage = usable_storage(options.storage)  # before the recipe is parsed (and seeded)
        sweep = read_sweep_file(sweep_path)
        # every swept key at one of its values: a key the recipe does not take, or a value of the wrong type, is one
        # error line now, not a failure of every trial
        cfg = parsed_fit_config(fit_args + [f"--{d.key}={as_cli_value(d.example())}" for d in sweep.dimensions])
        check_tracked(cfg)
        if is_follower():  # a DDP process started for rank 0's trials: it runs them, never asks the study
            return follow(fit_args)
        with requeue_signal_stops():  # under SLURM: SIGUSR1 between trials stops the sweep too, then requeues
            return run_sweep(options, fit_args, sweep, cfg)
    except (SweepError, SweepSpaceError, ValueError) as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except SQLAlchemyError as err:  # the storage failed after its check (the database went away, a lost connection)
        from recipes.tracking.database_urls import failure_reason, masked_url  # noqa: PLC0415

        storage = masked_url(str(options.storage))
        print(f"{PROG}: error: the sweep storage {storage} failed ({failure_reason(err)}); run the command again "
              "once the database answers: the study continues", file=sys.stderr)
        return 1
    except SIGTERMException as stop:
        code = stop.code if isinstance(stop.code, int) and stop.code else 130
        print(f"{PROG}: stopped (the current trial's run is KILLED; run the command again to continue the study)",
              file=sys.stderr)
        if code == SIGNAL_EXIT_CODES["SIGUSR1"]:  # SLURM's pre-kill signal; the requeued task continues the study
            from recipes.run.slurm import requeue  # noqa: PLC0415

            print(f"{PROG}: {requeue()}", file=sys.stderr)
        return code


__all__ = ["SweepError", "build_parser", "check_one_task", "main", "own_arguments", "parsed_fit_config",
           "split_arguments", "sweep_options", "usable_storage"]
