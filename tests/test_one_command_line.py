"""Every ``recipes`` command is parsed by jsonargparse (issue 54, item 5): no module of ``recipes`` imports argparse,
the options of ``compare`` and ``sync`` are a function's parameters whose ``--help`` is its docstring, each option
keeps its old spelling (``--max-runs`` and ``--max_runs`` alike), and a bad option is one ``error:`` line and exit 2.
The list of commands, a mistyped command and the help of ``compare`` and ``sync`` import no Lightning."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from recipes.cli import main
from tests.conftest import REPO, SPIRAL, free_port, recipes_env

COMMANDS = ["fit", "validate", "test", "predict", "compare", "sweep", "sync", "export", "pack"]


def test_no_module_of_recipes_imports_argparse():
    found = []
    for path in sorted((REPO / "recipes").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(name.split(".")[0] == "argparse" for name in names):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert found == []


#: each command line in one child process, in turn: its exit code and whether Lightning (or torch) was imported by then
LIGHT_COMMANDS = """
import sys
from recipes.cli import main
for args in ({commands!r}):
    try:
        main(args)
        code = 0
    except SystemExit as end:
        code = end.code
    print("RESULT", " ".join(args), "|", code, "lightning" in sys.modules, flush=True)
"""


def test_the_command_list_a_mistyped_command_and_the_help_of_compare_and_sync_import_no_lightning():
    commands = [["--help"], ["fitt"], [], ["compare", "--help"], ["sync", "--help"]]
    done = subprocess.run([sys.executable, "-c", LIGHT_COMMANDS.format(commands=commands)], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env=recipes_env())
    results = [line.split(" | ")[1] for line in done.stdout.splitlines() if line.startswith("RESULT")]
    assert results == ["0 False", "2 False", "2 False", "0 False", "0 False"], done.stdout + done.stderr[-3000:]
    listed = ", ".join(COMMANDS)
    assert done.stderr.splitlines() == [f"recipes: error: unknown command 'fitt'; the commands are {listed}",
                                        f"recipes: error: name a command; the commands are {listed}"]
    assert "--max_runs" in done.stdout and "newest N runs per experiment" in done.stdout  # compare's, its docstring
    assert "--checkpoints_dir" in done.stdout and "Where the runs' checkpoints are" in done.stdout  # sync's


def recipes(*args: str) -> int:
    """``recipes ...`` in this process: its exit code."""
    with pytest.raises(SystemExit) as end:
        main(list(args))
    return end.value.code


# --- compare --------------------------------------------------------------------------------------------------------
@pytest.mark.fresh_store
@pytest.mark.parametrize("spelling", ["-", "_"])
def test_compare_takes_each_option_with_dashes_or_underscores(workdir, capsys, spelling):
    port = free_port()  # nothing listens there: the command gets past its options to the store, and says so
    options = [f"--{name.replace('_', spelling)}" for name in ("tracking_uri", "max_runs", "checkpoints_dir")]
    args = [options[0], f"http://127.0.0.1:{port}", options[1], "3", options[2], "elsewhere", "--experiment", "e",
            "--metric", "val/acc", "--stage", "all", "--filter", "params.lr > 0.001", "--sort", "best:asc",
            "--format", "csv", "--plot", "p.png"]
    assert recipes("compare", *args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"recipes compare: error: the MLflow tracking server at http://127.0.0.1:{port} does not")
    assert recipes("compare", f"--{'max_runs'.replace('_', spelling)}=0") == 2
    assert capsys.readouterr().err == "recipes compare: error: --max-runs must be at least 1\n"


@pytest.mark.fresh_store
def test_a_compare_option_that_does_not_parse_is_one_error_line_and_exit_2(workdir, capsys):
    for bad, says in ((["--max-runs", "many"], "max_runs"), (["--stage", "fitt"], "stage"),
                      (["--format", "xml"], "format"), (["--colour"], "--colour"), (["--experiment"], "experiment")):
        assert recipes("compare", *bad) == 2, bad
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1, (bad, captured.err)
        assert captured.err.startswith("recipes compare: error: ") and says in captured.err, (bad, captured.err)


@pytest.mark.fresh_store
def test_compare_values_are_read_as_text(workdir, capsys):
    """A filter, a run id or an experiment name that YAML would read as a mapping, a list or a number is the text given
    (``null`` is jsonargparse's word for no value, as in every recipe option)."""
    from recipes.compare.command import build_parser

    values = {"filter": "params.lr: 1", "sweep": "1e10", "experiment": "2024", "sort": "params.lr:desc",
              "metric": "[a]"}
    parsed = build_parser().parse_args([f"--{key}={value}" for key, value in values.items()])
    assert {key: parsed[key] for key in values} == values


# --- sync -----------------------------------------------------------------------------------------------------------
def test_sync_takes_its_options_and_a_bad_one_is_one_line(workdir, capsys):
    assert recipes("sync", "--checkpoints_dir", "nowhere", "--tracking_uri", "sqlite:///x.db", "--verbose") == 2
    assert capsys.readouterr().err == "recipes: error: nowhere is not a folder of checkpoints (--checkpoints_dir)\n"
    for bad, says in ((["--colour"], "--colour"), (["--verbose=maybe"], "verbose"), (["--checkpoints_dir"], "")):
        code = recipes("sync", *bad)
        captured = capsys.readouterr()
        assert code == 2 and captured.out == "" and len(captured.err.splitlines()) == 1, captured.err
        assert captured.err.startswith("recipes sync: error: ") and says in captured.err, captured.err


# --- sweep ----------------------------------------------------------------------------------------------------------
def test_sweep_takes_its_options_anywhere_and_hands_every_other_argument_to_the_trials():
    from recipes.sweep.command import split_arguments
    from tests.sweep_runs import SWEEP

    options, fit_args, sweep_file = split_arguments(
        ["--n_trials=3", "-c", str(SPIRAL), "--trainer.max_epochs", "2", "--config", str(SWEEP), "--storage",
         "sqlite:///x.db", "--data.init_args.n_samples=600", "--timeout", "5", "--pruner", "none", "--direction",
         "minimize", "--metric", "val/loss", "--study_name", "s"])
    assert (options.n_trials, options.timeout, options.storage, options.pruner, options.direction, options.metric,
            options.study_name) == (3, 5.0, "sqlite:///x.db", "none", "minimize", "val/loss", "s")
    assert sweep_file == str(SWEEP)
    assert fit_args == ["-c", str(SPIRAL), "--mlflow_model=false", "--trainer.max_epochs", "2",
                        "--data.init_args.n_samples=600"]


def test_a_sweep_option_that_does_not_parse_is_one_error_line_and_exit_2(workdir, capsys):
    from tests.sweep_runs import SWEEP

    for bad, says in ((["--n_trials", "many"], "n_trials"), (["--pruner", "sometimes"], "pruner"),
                      (["--timeout"], "timeout"), (["--n_trials=0"], "--n_trials must be >= 1, got 0")):
        assert recipes("sweep", "-c", str(SPIRAL), "-c", str(SWEEP), *bad) == 2, bad
        captured = capsys.readouterr()
        assert captured.out == "" and len(captured.err.splitlines()) == 1, (bad, captured.err)
        assert captured.err.startswith("recipes sweep: error: ") and says in captured.err, (bad, captured.err)
    assert not (workdir / "optuna.db").exists()


def test_sweep_help_is_its_options_docstring(capsys):
    assert recipes("sweep", "--help") == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--n_trials N_TRIALS COMPLETE trials of the study in all" in out and "-c FILE, --config FILE" in out
    assert "--heartbeat_interval HEARTBEAT_INTERVAL seconds between a running trial" in out
