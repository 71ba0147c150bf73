"""``--ckpt_path best`` ranks by the command's own metric (issue 31, point 4).

The case of the issue: runs monitoring ``val/loss``, then one newer short run monitoring ``val/acc``. ``best`` used to
follow the newest run's monitor: it compared only the runs monitoring ``val/acc`` and took the short run, under any
command. Now a ``val/loss`` command takes the best ``val/loss`` run, and a ``val/acc`` command ranks every run by its
``val/acc`` when its ``best.ckpt`` was saved (a run whose file was chosen by ``val/loss``: the value in its MLflow
history at that step); a run without that history is skipped, and the message names each skipped run and why (5,
then "and N more")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from recipes.cli import main
from tests.conftest import SPIRAL, mlflow_client, runs_of

EXPERIMENT = "spiral_mlp"
VAL = ["--trainer.limit_val_batches", "2"]
BY_LOSS = ["--model.init_args.monitor", "val/loss"]
GOOD = [*BY_LOSS, "--trainer.max_epochs", "4", *VAL]  # the spiral task monitors val/acc unless told
WORSE = [*BY_LOSS, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
         "--model.init_args.optimizer.init_args.lr", "1e-6", *VAL]
SHORT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3", *VAL]  # monitors val/acc
TEST = ["--trainer.limit_test_batches", "2"]


def best_file(directory: Path, run_id: str) -> Path:
    return directory / "checkpoints" / EXPERIMENT / run_id / "best.ckpt"


def saved_at(directory: Path, run_id: str) -> tuple[int, int, str, float]:
    """(epoch from 0, global step, the metric its best.ckpt was chosen by, that value) of a run's best.ckpt."""
    ckpt = torch.load(best_file(directory, run_id), weights_only=True, map_location="cpu")
    (state,) = [s for k, s in ckpt["callbacks"].items() if "'alias': 'best'" in k]
    return ckpt["epoch"], ckpt["global_step"], state["monitor"], float(state["best_model_score"])


def logged_at_save(directory: Path, run_id: str, key: str) -> float:
    """The run's logged ``key`` at the validation that saved its best.ckpt, read with MLflow's own client: the step
    where the run logged the file's value of the metric that chose it (Lightning logs it one step before the global
    step the file records)."""
    _, step, monitor, value = saved_at(directory, run_id)
    client = mlflow_client(directory)
    (saved,) = [m.step for m in client.get_metric_history(run_id, monitor) if m.value == value and m.step <= step]
    assert saved == step - 1
    (logged,) = [m.value for m in client.get_metric_history(run_id, key) if m.step == saved]
    return logged


@pytest.fixture(scope="module")
def mixed(clean_workdir) -> dict:
    """Two fits monitoring val/loss (a good one, then a worse one) and a newer short one monitoring val/acc."""
    with clean_workdir("best_by_metric") as directory:
        for args in (GOOD, WORSE, SHORT):
            main(["fit", "-c", str(SPIRAL), *args])
        good, worse, short = (r.info.run_id for r in runs_of(directory, EXPERIMENT))
    return {"dir": directory, "good": good, "worse": worse, "short": short}


def chosen_line(out: str) -> str:
    return next(x for x in out.splitlines() if x.startswith("recipes: --ckpt_path best = "))


def run_test(directory: Path, capsys, *args: str) -> str:
    """``recipes test --ckpt_path best`` in ``directory``: the printed choice."""
    capsys.readouterr()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(directory)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        main(["test", "-c", str(SPIRAL), *TEST, "--ckpt_path", "best", *args])
    return chosen_line(capsys.readouterr().out)


@pytest.mark.slow  # the module's fixture: three small fits (about 25 s on 2 busy cores)
def test_a_val_loss_command_takes_the_best_val_loss_run_not_the_newest_runs_metric(mixed, capsys):
    directory, good, worse, short = mixed["dir"], mixed["good"], mixed["worse"], mixed["short"]
    losses = {run: saved_at(directory, run)[3] for run in (good, worse)}
    assert saved_at(directory, good)[2] == "val/loss" and losses[good] < losses[worse]
    assert saved_at(directory, short)[2] == "val/acc" and logged_at_save(directory, short, "val/loss") > losses[good]

    line = run_test(directory, capsys, *BY_LOSS)  # the old `best` took the short run: the newest run's val/acc
    assert f"(run {good}, epoch 4, val/loss {losses[good]:.4g} (best of 3 finished fit run(s), 1 ranked by their " \
           "val/loss history)" in line, line
    assert runs_of(directory, EXPERIMENT)[-1].data.tags["loopwise.ckpt_path"].endswith(f"{good}/best.ckpt")


@pytest.mark.slow
def test_a_val_acc_command_ranks_every_run_by_its_val_acc_when_its_best_ckpt_was_saved(mixed, capsys):
    directory = mixed["dir"]
    accuracy = {}
    for run in (mixed["good"], mixed["worse"], mixed["short"]):
        _, _, monitor, value = saved_at(directory, run)
        accuracy[run] = value if monitor == "val/acc" else logged_at_save(directory, run, "val/acc")
    winner = max(accuracy, key=accuracy.get)
    assert winner == mixed["good"] and accuracy[winner] > accuracy[mixed["short"]] + 0.05, accuracy

    line = run_test(directory, capsys)  # the spiral task's own monitor: val/acc (the user's command in the issue)
    assert (f"(run {winner}, epoch 4, val/acc {accuracy[winner]:.4g} (from its history at epoch 4; its best.ckpt was "
            "chosen by val/loss) (best of 3 finished fit run(s), 2 ranked by their val/acc history)") in line, line


@pytest.mark.slow
def test_runs_without_the_metric_in_their_history_are_each_listed_then_counted(mixed, tmp_path):
    """Seven more finished fit runs whose best.ckpt was chosen by val/acc and which logged nothing (copies of the
    short run's file, in a copy of the store): a val/loss command names five of them and why, then "and 2 more"."""
    from recipes.checkpoints.choice import choose_checkpoint
    from recipes.checkpoints.history_rank import CommandMetric

    shutil.copyfile(mixed["dir"] / "mlflow.db", tmp_path / "mlflow.db")
    shutil.copytree(mixed["dir"] / "checkpoints" / EXPERIMENT, tmp_path / "checkpoints" / EXPERIMENT)
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    silent = []
    for _ in range(7):
        run = client.create_run(experiment, tags={"loopwise.stage": "fit"})
        client.set_terminated(run.info.run_id, "FINISHED")
        best_file(tmp_path, run.info.run_id).parent.mkdir(parents=True)
        shutil.copyfile(best_file(mixed["dir"], mixed["short"]), best_file(tmp_path, run.info.run_id))
        silent.insert(0, run.info.run_id)  # newest first, as the store lists them
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    chosen = choose_checkpoint("best", EXPERIMENT, tmp_path / "checkpoints", uri, None,
                               metric=CommandMetric("val/loss", "min"))
    assert chosen.run_id == mixed["good"]
    named = "; ".join(f"run {run}: chosen by val/acc; no val/loss logged at epoch 1" for run in silent[:5])
    assert (f"; skipped 7 run(s) whose best.ckpt was chosen by another metric, with no val/loss in their history at "
            f"that step ({named}; and 2 more))") in chosen.description, chosen.description
    assert all(run not in chosen.description for run in silent[5:])

    # no run logged val/rmse (a regression metric): none can be ranked; the error names the skipped runs and the way out
    rmse = CommandMetric("val/rmse", "min")
    with pytest.raises(FileNotFoundError) as err:
        choose_checkpoint("best", EXPERIMENT, tmp_path / "checkpoints", uri, None, metric=rmse)
    message = str(err.value)
    assert message.startswith(f"--ckpt_path best: no best.ckpt of experiment {EXPERIMENT!r} under ")
    assert ("can be ranked by val/rmse; skipped 10 run(s) whose best.ckpt was chosen by another metric, with no "
            "val/rmse in their history at that step (run ") in message
    assert "; and 5 more); choose one yourself" in message and "--model.init_args.monitor <metric>" in message
    assert len(message.splitlines()) == 1


@pytest.mark.slow
def test_a_task_without_a_monitor_keeps_the_newest_runs_metric_and_says_so(mixed):
    from lightning.pytorch import LightningModule

    from lightning_modules import ClassificationModule, RegressionModule
    from recipes.checkpoints.choice import choose_checkpoint
    from recipes.checkpoints.history_rank import CommandMetric, command_metric

    assert command_metric(ClassificationModule, None, None) == CommandMetric("val/acc", "max")
    assert command_metric(ClassificationModule, "val/loss", None) == CommandMetric("val/loss", "min")
    assert command_metric(RegressionModule, "val/mae", "max") == CommandMetric("val/mae", "max")
    assert command_metric(LightningModule, None, None) is None

    directory, short = mixed["dir"], mixed["short"]
    uri = f"sqlite:///{directory / 'mlflow.db'}"
    chosen = choose_checkpoint("best", EXPERIMENT, directory / "checkpoints", uri, None, metric=None)
    assert chosen.run_id == short  # as before: the newest run's val/acc decides which runs compare
    assert ("(best of 1 finished fit run(s), by the newest run's val/acc: this command's task names no monitor; "
            f"skipped 2 run(s) monitoring another metric than the newest run's val/acc (run {mixed['worse']}: val/loss "
            f"(min); run {mixed['good']}: val/loss (min)))") in \
        chosen.description, chosen.description
