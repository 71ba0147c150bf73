"""A recipe on two machines (issue 21, part 3), played on one: two `torchrun` processes, `--nnodes 2`, node ranks 0 and
1, a rendezvous on 127.0.0.1 and gloo, both in one directory as on a shared file system.

`recipes fit -c configs/spiral_mlp.yaml -c configs/trainer/ddp.yaml --trainer.num_nodes 2` on each "node" (one
process each, `--trainer.devices 1`): one MLflow run, the plan counts the world size, checkpoints from global rank 0,
and `--ckpt_path last` on both nodes continues the same run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from recipes.checkpoints.files import read_run_stamp
from tests.conftest import DDP, SPIRAL, free_port, mlflow_client, recipes_env, runs_of
from tests.preloaded_python import preloaded_popen

pytestmark = pytest.mark.slow


def on_two_nodes(directory: Path, *extra: str) -> list[str]:
    """`torchrun --nnodes 2 --node_rank N ... -m recipes fit ...` for N = 0, 1, started together; their outputs."""
    if not (directory / "data").exists():
        (directory / "data").symlink_to(Path(__file__).resolve().parents[2] / "data")
    port = free_port()
    recipe = ["fit", "-c", str(SPIRAL), "-c", str(DDP), "--trainer.accelerator", "cpu", "--trainer.devices", "1",
              "--trainer.num_nodes", "2", "--mlflow_model", "false", "--system_metrics_interval", "0", *extra]
    processes = []
    for node in (0, 1):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
                    "--node_rank", str(node), "--master_addr", "127.0.0.1", "--master_port", str(port)]
        # torchrun and the worker it starts forked from the preloaded Python (tests/preloaded_python.py)
        processes.append(preloaded_popen([*torchrun, "-m", "recipes", *recipe], cwd=directory, env=recipes_env(),
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = []
    try:
        for process in processes:
            output, _ = process.communicate(timeout=420)  # a deadlock fails the test instead of hanging CI
            outputs.append(output)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output[-4000:]
    return outputs


def test_two_nodes_make_one_run_counted_over_the_world_and_resume_together(tmp_path):
    node0, node1 = on_two_nodes(tmp_path, "--trainer.max_epochs", "1")
    assert (node0 + node1).count("Training plan") == 1  # printed by global rank 0 only
    (run,) = runs_of(tmp_path, "spiral_mlp")  # node 1 made no run of its own
    assert run.info.status == "FINISHED"
    p = run.data.params
    # 1,400 train samples over a world of 2 (2 nodes x 1 device): 700 per rank, 11 batches of 64 (the last 60)
    assert p["plan.devices"] == "2" and p["plan.effective_batch_size"] == "128"
    assert p["plan.batches_per_epoch"] == "11" and p["plan.optimizer_steps_per_epoch"] == "11"
    # one checkpoint folder, rank 0's, named after its run
    run_id = run.info.run_id
    folders = (tmp_path / "checkpoints" / "spiral_mlp").iterdir()
    run_dirs = [d for d in folders if not d.name.startswith(".")]  # not .resume-locks
    assert [d.name for d in run_dirs] == [run_id]
    last = run_dirs[0] / "last.ckpt"
    assert read_run_stamp(last) == {"mlflow_run_id": run_id, "experiment": "spiral_mlp", "step": "11"}
    assert torch.load(last, weights_only=True)["global_step"] == 11

    # both nodes resume from last.ckpt: the same run goes on for a second epoch
    on_two_nodes(tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    (resumed,) = runs_of(tmp_path, "spiral_mlp")
    assert resumed.info.run_id == run_id and resumed.info.status == "FINISHED"
    folders = [d.name for d in (tmp_path / "checkpoints" / "spiral_mlp").iterdir() if not d.name.startswith(".")]
    assert folders == [run_id]  # beside .resume-locks, the lock rank 0 held for the resume
    assert torch.load(last, weights_only=True)["global_step"] == 22
    history = mlflow_client(tmp_path).get_metric_history(run_id, "val/acc")
    assert len(history) == 2  # one value per epoch, the second from the resumed run
