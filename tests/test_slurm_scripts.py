"""Issue 58: the three ``sbatch`` scripts of docs/how-to/slurm.md, parsed, and their ``srun`` command lines run as a
SLURM task runs them (SLURM's variables set; no SLURM here). The single run trains as shown; the DDP one, which asks
for 8 GPUs on 2 nodes, is parsed by the command (``--print_config``); the sweep runs as one array task with its
database replaced by a SQLite file and its length cut (``--n_trials 2``, 2 epochs), each appended after the line."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tests.conftest import REPO, mlflow_client

PAGE = REPO / "docs" / "how-to" / "slurm.md"
SCRIPT = re.compile(r"```bash\n(#!/bin/bash\n.*?)```", re.S)
TASK = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "docs", "SLURM_JOB_ID": "777", "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "127.0.0.1"}


def scripts() -> list[tuple[dict[str, str], list[str]]]:
    """Each script's ``#SBATCH`` options and its ``srun`` command line (continuations joined, ``srun`` dropped)."""
    found = []
    for text in SCRIPT.findall(PAGE.read_text()):
        options = {}
        for line in text.splitlines():
            if line.startswith("#SBATCH"):
                for option in line.split()[1:]:
                    key, _, value = option.partition("=")
                    options[key] = value
        command = re.search(r"^srun (.*?)(?:\n(?!\s)|\Z)", text.replace("\\\n", " "), re.S | re.M).group(1)
        found.append((options, shlex.split(command)))
    return found


SCRIPTS = scripts()


def test_the_page_holds_three_scripts_that_ask_for_the_signal_and_the_requeue():
    assert len(SCRIPTS) == 3
    for options, command in SCRIPTS:
        assert "--requeue" in options and re.fullmatch(r"USR1@\d+", options["--signal"]), options
        assert command[0] == "recipes" and command[1] in ("fit", "sweep")
        for config in command[command.index("-c") + 1 :: 2][:1]:
            assert (REPO / config).is_file(), config
    ddp_options, ddp = SCRIPTS[1]
    nodes, per_node = int(ddp_options["--nodes"]), int(ddp_options["--ntasks-per-node"])
    assert ddp[ddp.index("--trainer.num_nodes") + 1] == str(nodes)
    assert ddp[ddp.index("--trainer.devices") + 1] == str(per_node) == ddp_options["--gpus-per-node"]
    assert "--array" in SCRIPTS[2][0]


def run_task(command: list[str], workdir: Path, extra_env: dict[str, str]) -> subprocess.CompletedProcess:
    (workdir / "configs").symlink_to(REPO / "configs", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI" and not k.startswith("SLURM_")}
    env.update({**TASK, **extra_env, "PYTHONPATH": str(REPO)})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_single_run_script_trains_as_a_slurm_task_and_tags_its_job(tmp_path):
    out = run_task(SCRIPTS[0][1], tmp_path, {})
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = mlflow_client(tmp_path).search_runs(["1"])
    assert run.info.status == "FINISHED" and run.data.tags["loopwise.slurm_job"] == "777"
    assert not list(tmp_path.rglob("hpc_ckpt_*.ckpt"))


def test_the_ddp_script_s_command_line_parses_as_a_task_of_its_8_task_job(tmp_path):
    options, command = SCRIPTS[1]
    world = str(int(options["--nodes"]) * int(options["--ntasks-per-node"]))
    out = run_task([*command, "--print_config"], tmp_path, {
        "SLURM_NTASKS": world, "SLURM_NTASKS_PER_NODE": options["--ntasks-per-node"], "SLURM_NNODES": options["--nodes"]})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "num_nodes: 2" in out.stdout and "devices: '4'" in out.stdout and "DDPStrategy" in out.stdout


@pytest.mark.slow
def test_the_sweep_array_script_runs_as_one_array_task(tmp_path):
    _, command = SCRIPTS[2]
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    command = [storage if arg.startswith("postgresql://") else arg for arg in command]
    out = run_task([*command, "--n_trials", "2", "--trainer.max_epochs", "2"], tmp_path,
                   {"SLURM_ARRAY_JOB_ID": "770", "SLURM_ARRAY_TASK_ID": "3"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    study = optuna.load_study(study_name="spiral_mlp-sweep", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    runs = mlflow_client(tmp_path).search_runs(["1"])
    trials = [r for r in runs if r.data.tags.get("loopwise.stage") == "fit"]
    assert len(trials) == 2 and {r.data.tags["loopwise.slurm_job"] for r in trials} == {"770_3"}
