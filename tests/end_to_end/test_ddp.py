"""Recipes under 2-process DDP on CPU (gloo): `python -m recipes fit ... -c configs/trainer/ddp.yaml`.

Each fit runs in a subprocess: Lightning's DDP launcher starts rank 1 by re-running the command line, which must be
`python -m recipes`, not pytest. The checks: one MLflow run written by rank 0, the plan's world-size arithmetic, one
checkpoint directory, epoch metrics reduced over both ranks, and per-rank shards of the custom samplers.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from recipes.checkpoints.files import read_run_stamp
from recipes.cli import main
from tests.preloaded_python import preloaded_popen
from tests.conftest import (
    CONFIGS,
    SPIRAL,
    mlflow_client,
    on_two_processes,
    recipes_env,
    runs_of,
    two_process_command,
)

SPIRAL_EPOCHS = 2


def fit_on_two_processes(directory: Path, recipe: Path, epochs: int, *extra: str) -> subprocess.CompletedProcess:
    """`python -m recipes fit -c <recipe> -c ddp.yaml` on 2 CPU processes in ``directory`` (embedded MLflow)."""
    return on_two_processes(directory, "fit", recipe, "--trainer.max_epochs", str(epochs), *extra)


def the_run(directory: Path, experiment: str):
    runs = runs_of(directory, experiment)
    assert len(runs) == 1, [(r.info.run_id, r.info.status) for r in runs]  # rank 1 made no run of its own
    assert runs[0].info.status == "FINISHED"
    return runs[0]


def lightning_noise(output: str) -> list[str]:
    """Lines of a run's output that would mean DDP is misused: unsynced epoch logging, a plan/loop disagreement."""
    return [line for line in output.splitlines() if "sync_dist" in line or "TrainingPlan:" in line]


@pytest.fixture(scope="module")
def spiral_ddp(tmp_path_factory):
    """One `recipes fit` of the spiral recipe on 2 processes, shared by the tests below."""
    directory = tmp_path_factory.mktemp("spiral_ddp")
    out = fit_on_two_processes(directory, SPIRAL, SPIRAL_EPOCHS)
    return directory, out


@pytest.mark.slow
def test_spiral_on_two_processes_is_one_run_with_world_size_arithmetic(spiral_ddp):
    directory, out = spiral_ddp
    assert lightning_noise(out.stdout + out.stderr) == []
    assert out.stdout.count("Training plan") == 1  # printed by rank 0 only
    run = the_run(directory, "spiral_mlp")
    p = run.data.params
    # 1,400 train samples over 2 ranks: 700 per rank, batch 64 per rank -> 11 batches (10 x 64 + 60), 11 steps
    per_rank = math.ceil(1400 / 2)
    batches = math.ceil(per_rank / 64)
    assert (per_rank, batches) == (700, 11)
    assert p["train_samples"] == "1400" and p["devices"] == "2" and p["plan.devices"] == "2"
    assert p["batch_size"] == "64" and p["effective_batch_size"] == str(64 * 2)
    assert p["plan.effective_batch_size"] == "128" and p["plan.batch_size"] == "64"
    assert p["plan.batches_per_epoch"] == str(batches) and p["plan.last_batch_size"] == str(per_rank - 10 * 64)
    assert p["plan.optimizer_steps_per_epoch"] == "11"
    assert p["plan.total_optimizer_steps"] == p["total_optimizer_steps"] == str(SPIRAL_EPOCHS * 11)
    assert p["plan.examples_seen"] == str(SPIRAL_EPOCHS * 1400)
    assert p["plan.warmup_steps"] == str(round(0.05 * SPIRAL_EPOCHS * 11))  # warmup_fraction 0.05 of the real steps
    client = mlflow_client(directory)
    run_id = run.info.run_id
    assert len(client.get_metric_history(run_id, "val/acc")) == SPIRAL_EPOCHS  # one value per epoch
    assert len(client.get_metric_history(run_id, "val/loss")) == SPIRAL_EPOCHS
    assert len(client.get_metric_history(run_id, "train/loss")) >= SPIRAL_EPOCHS * 11 // 10 - 1  # every 10 steps
    # the loop doctor times the loader itself under DDP, not Lightning's per-batch wait for the other rank
    waits = [m.value for m in client.get_metric_history(run_id, "doctor/data_wait_fraction")]
    assert len(waits) == SPIRAL_EPOCHS and max(waits) < 0.3 and "doctor.data_wait" not in run.data.tags
    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "checkpoints", "confusion_matrix_val.png"} <= top
    assert {a.path for a in client.list_artifacts(run_id, "checkpoints")} == {
        "checkpoints/best.ckpt",
        "checkpoints/last.ckpt",
    }
    # one checkpoint directory, named after the run rank 0 created; both files carry its id
    folders = (directory / "checkpoints" / "spiral_mlp").iterdir()
    run_dirs = [d for d in folders if not d.name.startswith(".")]  # not .resume-locks
    assert [d.name for d in run_dirs] == [run_id]
    assert sorted(f.name for f in run_dirs[0].iterdir()) == [
        "best.ckpt", "checkpoint-uploads.json", "last.ckpt", "tracking-journal.jsonl"]  # fmt: skip
    for name in ("best.ckpt", "last.ckpt"):
        stamp = read_run_stamp(run_dirs[0] / name)
        assert (stamp["mlflow_run_id"], stamp["experiment"]) == (run_id, "spiral_mlp")
    last = torch.load(run_dirs[0] / "last.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (SPIRAL_EPOCHS - 1, SPIRAL_EPOCHS * 11)


def spiral_logits(checkpoint: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, targets) of ``checkpoint`` on a split of the spiral recipe's data, in split order, in this process."""
    from datamodules import SpiralDataModule
    from lightning_modules import ClassificationModule

    recipe = yaml.safe_load(SPIRAL.read_text())
    data = SpiralDataModule(**recipe["data"]["init_args"])
    data.setup("validate")
    inputs, targets = data.datasets[split].tensors  # type: ignore[attr-defined]
    module = ClassificationModule.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    with torch.no_grad():
        return module(inputs), targets


def spiral_val_predictions(checkpoint: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, per-sample loss) of ``checkpoint`` on the spiral recipe's 399 val samples, in split order."""
    logits, targets = spiral_logits(checkpoint, "val")
    return (logits.argmax(-1) == targets).double(), F.cross_entropy(logits, targets, reduction="none").double()


@pytest.mark.slow
def test_spiral_val_metrics_are_reduced_over_both_ranks(spiral_ddp, monkeypatch):
    directory, _ = spiral_ddp
    run = the_run(directory, "spiral_mlp")
    best_path = directory / "checkpoints" / "spiral_mlp" / run.info.run_id / "best.ckpt"
    best = torch.load(best_path, weights_only=True)
    state = next(v for k, v in best["callbacks"].items() if "'alias': 'best'" in k)
    best_acc = float(state["best_model_score"])
    correct, loss = spiral_val_predictions(best_path)
    n = len(correct)
    assert n == 399
    # each rank validates its own shard of the 399 samples with none repeated (EvaluationShardSampler: 200 and 199;
    # Lightning's DistributedSampler padded them to 400 with sample 0 twice), and the states are synced: the metrics
    # of all 399 samples, on both ranks (rank 0's half alone would give other numbers)
    assert best_acc == pytest.approx(float(correct.mean()), abs=1e-6)  # torchmetrics: synced states
    client = mlflow_client(directory)
    history = sorted(client.get_metric_history(run.info.run_id, "val/acc"), key=lambda m: m.step)
    assert max(m.value for m in history) == pytest.approx(best_acc, abs=1e-6)
    at_best = [m.step for m in history if m.value == pytest.approx(best_acc, abs=1e-6)][0]
    val_loss = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "val/loss")}[at_best]
    # a metric of two sums (loss x samples, samples) added over the ranks: the mean over the 399 samples
    assert val_loss == pytest.approx(float(loss.mean()), rel=1e-5)
    # a single-process validation of the same checkpoint sees each of the 399 samples once, as the ranks did together
    monkeypatch.chdir(directory)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", "best"])
    validation = runs_of(directory, "spiral_mlp")[-1]
    assert validation.data.tags["loopwise.stage"] == "validate"
    assert validation.data.tags["loopwise.ckpt_path"] == str(best_path.resolve())
    single = validation.data.metrics["val/acc"]
    assert single == pytest.approx(float(correct.mean()), abs=1e-6)
    assert single == best_acc
    assert validation.data.metrics["val/loss"] == pytest.approx(val_loss, rel=1e-5)


@pytest.mark.slow
def test_spiral_predict_on_two_processes_writes_every_sample_in_order(spiral_ddp):
    # each rank predicts every other sample of the 201 test samples; rank 0 gathers them into one CSV in split order
    directory, _ = spiral_ddp
    out_csv = directory / "ddp_predictions.csv"
    on_two_processes(directory, "predict", SPIRAL, "--ckpt_path", "best", "--predictions_path", str(out_csv))
    rows = out_csv.read_text().splitlines()
    assert rows[0] == "row,prediction,prob_0,prob_1,prob_2" and len(rows) == 1 + 201
    written = torch.tensor([[float(v) for v in r.split(",")[2:]] for r in rows[1:]])
    run = [r for r in runs_of(directory, "spiral_mlp") if r.data.tags["loopwise.stage"] == "fit"][0]
    logits, _ = spiral_logits(directory / "checkpoints" / "spiral_mlp" / run.info.run_id / "best.ckpt", "test")
    assert torch.allclose(written, logits.softmax(-1), atol=1e-6)
    predict_runs = [r for r in runs_of(directory, "spiral_mlp") if r.data.tags["loopwise.stage"] == "predict"]
    assert len(predict_runs) == 1 and predict_runs[0].info.status == "FINISHED"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("recipe", "sampler"),
    [("tabular_mlp", "ClassBalancedSampler"), ("text_transformer", "LengthBucketBatchSampler")],
)
def test_file_backed_recipe_on_two_processes_shards_its_sampler(tmp_path, recipe, sampler):
    # the tabular recipe samples classes evenly on request (class_balance), at a fixed batch size of 64
    balanced = ["--data.init_args.class_balance", "true", "--data.init_args.batch_size", "64"]
    extra = balanced if recipe == "tabular_mlp" else []
    out = fit_on_two_processes(tmp_path, CONFIGS / f"{recipe}.yaml", 1, *extra)
    assert lightning_noise(out.stdout + out.stderr) == []
    run = the_run(tmp_path, recipe)
    p = run.data.params
    train = int(p["train_samples"])
    # each rank draws (ClassBalancedSampler) or batches (length buckets around Lightning's DistributedSampler) its
    # own ceil(N / 2) shard: half the batches of one process, which the steps of the finished epoch confirm
    batches = math.ceil(math.ceil(train / 2) / 64)
    assert p["plan.devices"] == "2" and p["plan.effective_batch_size"] == "128"
    assert p["plan.train_samples"] == str(train) and p["plan.batches_per_epoch"] == str(batches)
    assert p["plan.total_optimizer_steps"] == p["total_optimizer_steps"] == str(batches)
    if sampler == "LengthBucketBatchSampler":
        assert p["plan.last_batch_size"] == "variable"
    client = mlflow_client(tmp_path)
    for metric in ("val/acc", "val/auroc", "val/loss", "train/acc"):
        assert len(client.get_metric_history(run.info.run_id, metric)) == 1, metric
    assert 0.0 <= run.data.metrics["val/acc"] <= 1.0
    run_dir = tmp_path / "checkpoints" / recipe / run.info.run_id
    last = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert last["global_step"] == batches
    assert read_run_stamp(run_dir / "best.ckpt")["mlflow_run_id"] == run.info.run_id


@pytest.mark.slow
def test_sigterm_on_two_processes_stops_both_saves_last_and_marks_the_run_killed(tmp_path):
    # Lightning 2.6's own SIGTERM handler broadcasts from inside the handler and deadlocks DDP; RunContinuity makes
    # the ranks agree on the signal after a batch, so both stop there and save last.ckpt together
    command = two_process_command(tmp_path, "fit", SPIRAL, "--trainer.max_epochs", "40")
    proc = preloaded_popen(command, cwd=tmp_path, env=recipes_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("checkpoints/spiral_mlp/*/last.ckpt")):  # after the first epoch
            assert proc.poll() is None and time.monotonic() < deadline, "the fit ended or never saved last.ckpt"
            time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # rank 0 only, as a scheduler's `kill <pid>` would
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert "SIGTERM received: saved" in out and out.count("Training plan") == 1
    run = runs_of(tmp_path, "spiral_mlp")
    assert [r.info.status for r in run] == ["KILLED"]
    last_path = tmp_path / "checkpoints" / "spiral_mlp" / run[0].info.run_id / "last.ckpt"
    last = torch.load(last_path, weights_only=True)
    assert 11 <= last["global_step"] < 40 * 11  # stopped after the first epoch, long before the end
    assert last["loopwise"]["mlflow_run_id"] == run[0].info.run_id
