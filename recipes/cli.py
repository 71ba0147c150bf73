"""The ``recipes`` command: ``main()`` and its table of commands.

``fit``, ``validate``, ``test`` and ``predict`` run one recipe through ``recipes.run.recipes_cli.RecipesCLI``;
``compare``, ``sweep``, ``sync``, ``export`` and ``pack`` are commands of their own (``recipes.compare``,
``recipes.sweep``, ``recipes.tracking.sync``, ``recipes.export``, ``recipes.pack``), imported only when named so that
``import recipes.cli`` stays light.
"""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import Any

#: the packages of the ``loopwise[recipes]`` extra that the command imports (``pip install loopwise`` has none)
RECIPES_EXTRA = frozenset({"jsonargparse", "mlflow", "optuna", "optuna_integration", "sqlalchemy", "yaml", "psutil",
                           "matplotlib", "docstring_parser", "typeshed_client"})
#: the commands that run one recipe through LightningCLI (``recipes.run.recipes_cli.RecipesCLI``)
RECIPE_COMMANDS = ("fit", "validate", "test", "predict")
#: every command, in the order of ``COMMANDS``
COMMAND_NAMES = (*RECIPE_COMMANDS, "compare", "sweep", "sync", "export", "pack")

COMMANDS = """recipes commands:
  fit        train a recipe:                   recipes fit -c configs/spiral_mlp.yaml
  validate   evaluate a checkpoint on val:     recipes validate -c ... --ckpt_path best|last|mlflow:<run>/best|<file>
  test       evaluate a checkpoint on test:    recipes test -c ... --ckpt_path best
  predict    predict new rows or images:       recipes predict -c ... --ckpt_path best --data.init_args.predict_path F
  compare    runs side by side:                recipes compare [--experiment E] [--sweep STUDY] [--plot P]
  sweep      hyperparameter search (Optuna):   recipes sweep -c <recipe> -c configs/sweeps/<recipe>.yaml --n_trials N
  sync       write a run's journal to MLflow:  recipes sync [--checkpoints_dir checkpoints]
  export     a HF network for transformers:    recipes export -c ... --ckpt_path best --export_dir DIR
  pack       an image folder as Parquet shards: recipes pack <image folder> <out> [--shard_mb 256]
Each takes --help.
usage: recipes {fit,validate,test,predict} [-c CONFIG] [options] | recipes {compare,sweep,sync,export,pack} [options]
"""


def main(args: list[str] | None = None) -> None:
    """Entry point of ``recipes`` and ``python -m recipes``; ``args`` defaults to ``sys.argv[1:]``.

    Config, data and checkpoint problems found before the loop starts end with one ``recipes: error:`` line and
    exit code 2; errors during training keep their traceback. SIGTERM / SIGINT during ``fit`` save ``last.ckpt``,
    mark the MLflow run KILLED and exit 143 / 130. ``recipes compare ...`` compares runs (``recipes.compare.command``).
    No password of a tracking or storage URL reaches the output, whoever prints it
    (``recipes.tracking.hidden_passwords``). The list of commands, a mistyped command and the commands that only read
    a store (``compare``, ``sync``) import no Lightning (nor torch, unless the process had).
    """
    argv = sys.argv[1:] if args is None else list(args)
    missing = next((name for name in sorted(RECIPES_EXTRA) if not installed(name)), None)
    if missing is not None:
        extra_missing(missing)
    from recipes.run.process_settings import process_settings_kept  # noqa: PLC0415
    from recipes.tracking.hidden_passwords import passwords_hidden_in_output  # noqa: PLC0415
    from recipes.tracking.quiet_mlflow import no_run_links  # noqa: PLC0415

    command = argv[0] if argv else ""
    # torch's switches are kept for the commands that set them; the others would only pay torch's import for it
    sets_torch = command in (*RECIPE_COMMANDS, "sweep", "export") or (command.startswith("-") and
                                                                     command not in ("-h", "--help"))
    try:
        # in a notebook, the next command starts from the user's settings, not this one's
        with process_settings_kept(torch_switches=sets_torch), passwords_hidden_in_output(argv), no_run_links():
            run_command(args)
    except ModuleNotFoundError as missing_module:  # the modules were installed without the command's whole stack
        if (missing_module.name or "").split(".")[0] not in RECIPES_EXTRA:
            raise
        extra_missing(missing_module.name or "")


def installed(name: str) -> bool:
    """Whether the top-level package ``name`` can be imported (imported already, or found), without importing it."""
    if name in sys.modules:  # find_spec raises ValueError for a module imported without a __spec__
        return sys.modules[name] is not None
    return find_spec(name) is not None


def extra_missing(name: str) -> None:
    """The one line of a ``recipes`` command whose extra is not installed (``name``: the package missing), exit 1."""
    raise SystemExit(f"recipes: error: the recipes command needs its extra ({name} is not installed): "
                     "pip install 'loopwise[recipes]'")


def command_error(message: str) -> None:
    """One ``recipes: error:`` line naming the commands, exit code 2."""
    print(f"recipes: error: {message}; the commands are {', '.join(COMMAND_NAMES)}", file=sys.stderr)
    raise SystemExit(2)


def run_command(args: list[str] | None) -> None:
    """``main`` without putting the process's settings back (``recipes.run.process_settings``)."""
    argv = sys.argv[1:] if args is None else list(args)
    if argv[:1] in (["-h"], ["--help"]):
        print(COMMANDS)
        raise SystemExit(0)
    if not argv:
        command_error("name a command")
    if argv[0] == "compare":
        from recipes.compare.command import main as compare_main  # noqa: PLC0415

        raise SystemExit(compare_main(argv[1:]))
    if argv[0] == "sweep":
        from recipes.sweep.command import main as sweep_main  # noqa: PLC0415

        raise SystemExit(sweep_main(argv[1:]))
    if argv[0] == "export":
        from recipes.export.command import main as export_main  # noqa: PLC0415

        raise SystemExit(export_main(argv[1:]))
    if argv[0] == "sync":
        from recipes.tracking.sync import main as sync_main  # noqa: PLC0415

        raise SystemExit(sync_main(argv[1:]))
    if argv[0] == "pack":
        from recipes.pack.command import main as pack_main  # noqa: PLC0415

        raise SystemExit(pack_main(argv[1:]))
    if argv[0] not in RECIPE_COMMANDS and not argv[0].startswith("-"):  # options first: LightningCLI reads them
        command_error(f"unknown command {argv[0]!r}")
    run_recipe(args)


def fit_wants_test(cli: Any) -> bool:
    """Whether ``cli`` ran ``fit`` with ``--test_after_fit true`` and the fit finished (not stopped by a signal)."""
    from lightning.pytorch.trainer.states import TrainerStatus  # noqa: PLC0415

    if cli.subcommand != "fit" or not cli.subcommand_config.get("test_after_fit"):
        return False
    return cli.trainer.state.status == TrainerStatus.FINISHED and not cli.trainer.interrupted


def fit_best_checkpoint(cli: Any) -> str | None:
    """The ``best.ckpt`` this fit wrote (its ``RunCheckpoint``); ``None`` when it wrote none."""
    from recipes.callbacks.run_checkpoint import RunCheckpoint  # noqa: PLC0415

    for callback in cli.trainer.callbacks:
        if isinstance(callback, RunCheckpoint) and callback.alias == "best" and callback.best_model_path:
            return str(callback.best_model_path)
    return None


def after_fit_test_arguments(fit_args: list[str], checkpoint: str) -> list[str]:
    """``recipes fit <args>`` as ``recipes test <args> --ckpt_path <checkpoint>``: "fit" (the first such word, the
    subcommand) becomes "test"; the fit's own ``--ckpt_path`` (a resume) is overridden by the later one."""
    at = fit_args.index("fit")
    return [*fit_args[:at], "test", *fit_args[at + 1 :], "--ckpt_path", checkpoint]


def run_recipe(args: list[str] | None) -> None:
    """``recipes fit|validate|test|predict ...``: one recipe through ``RecipesCLI``, its problems in one line."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: PLC0415
    from lightning.pytorch.utilities.rank_zero import rank_zero_only  # noqa: PLC0415

    from recipes.callbacks.stop_evaluation_on_signal import EvaluationStopped  # noqa: PLC0415
    from recipes.callbacks.stop_on_signal import SIGNAL_EXIT_CODES  # noqa: PLC0415
    from recipes.checkpoints.atomic_io import CheckpointDiskFull  # noqa: PLC0415
    from recipes.checkpoints.run_lock import release_run_locks  # noqa: PLC0415
    from recipes.run.errors import RecipeInputError  # noqa: PLC0415
    from recipes.run.recipes_cli import RecipesCLI  # noqa: PLC0415
    from recipes.run.slurm import requeue_signal_stops  # noqa: PLC0415

    try:
        with requeue_signal_stops():  # under SLURM: SIGUSR1 outside training stops the command too, then requeues
            cli = RecipesCLI(args=args)
        if fit_wants_test(cli):
            best = fit_best_checkpoint(cli)
            if best is None:
                print("recipes: --test_after_fit: this fit wrote no best.ckpt (fast_dev_run, or no validation ran); "
                      "nothing tested", file=sys.stderr)
            else:
                run_recipe(after_fit_test_arguments(sys.argv[1:] if args is None else list(args), best))
    except RecipeInputError as err:
        print(f"recipes: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except CheckpointDiskFull as full:  # the run is marked FAILED by Lightning; the previous checkpoint is intact
        print(f"recipes: error: {full}", file=sys.stderr)
        raise SystemExit(1) from None
    except EvaluationStopped as stop:
        print(stop.describe(), file=sys.stderr)
        raise SystemExit(stop.code) from None
    except SIGTERMException as stop:  # Lightning raises it without a code, which would exit 0
        code = stop.code if isinstance(stop.code, int) and stop.code else SIGNAL_EXIT_CODES["SIGTERM"]
        name = next((sig for sig, exit_code in SIGNAL_EXIT_CODES.items() if exit_code == code), "SIGTERM")
        if rank_zero_only.rank == 0:  # under DDP every process stops; one says so
            print(f"recipes: stopped by {name} (run marked KILLED, last.ckpt saved)", file=sys.stderr)
            if name == "SIGUSR1":  # SLURM's pre-kill signal: the job comes back and resumes this run
                from recipes.run.slurm import requeue  # noqa: PLC0415

                print(f"recipes: {requeue()}", file=sys.stderr)
        raise SystemExit(code) from None
    finally:
        release_run_locks()  # the command is over: its run may be resumed (this process may run another command)
