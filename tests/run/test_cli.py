"""The `recipes` command in-process: the spiral recipe end to end on the embedded MLflow store."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import yaml

from recipes.cli import main
from tests.preloaded_python import LIBRARIES, preloaded_run
from tests.conftest import CONFIGS, REPO, SPIRAL, mlflow_client, runs_of
from tests.hf_models import hf_overrides

RECIPES = sorted(p for p in CONFIGS.glob("*.yaml"))
FRAGMENTS = sorted(p for p in (CONFIGS / "trainer").glob("*.yaml"))


@pytest.fixture(scope="module")
def fitted(clean_workdir):
    """One full `recipes fit -c configs/spiral_mlp.yaml` in its own directory, shared by the tests below."""
    with clean_workdir("spiral_fit") as directory:
        main(["fit", "-c", str(SPIRAL)])
    return directory


@pytest.mark.slow
def test_fit_reaches_target_and_records_one_finished_run(fitted):
    runs = runs_of(fitted, "spiral_mlp")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.status == "FINISHED"
    client = mlflow_client(fitted)
    history = client.get_metric_history(run.info.run_id, "val/acc")
    assert max(m.value for m in history) >= 0.95
    assert len(history) == 40  # one value per epoch
    assert len(client.get_metric_history(run.info.run_id, "train/loss")) >= 40 * 22 // 10 - 1
    # curated params
    p = run.data.params
    assert p["lr"] == "0.01" and p["batch_size"] == "64" and p["effective_batch_size"] == "64"
    assert p["schedule"] == "WarmupCosine" and p["optimizer"] == "AdamW" and p["seed"] == "0"
    assert p["train_samples"] == "1400" and p["val_samples"] == "399" and p["test_samples"] == "201"
    assert p["total_optimizer_steps"] == str(40 * 22) and p["precision"] == "32-true"
    assert p["task"] == "ClassificationModule" and p["network"] == "MLP" and p["data"] == "SpiralDataModule"
    assert run.data.tags["loopwise.recipe"] == "spiral_mlp" and run.data.tags["loopwise.stage"] == "fit"
    # the training plan and the loop doctor run in every recipe; a healthy run has no findings
    assert p["plan.batches_per_epoch"] == "22" and p["plan.last_batch_size"] == "56"
    assert p["plan.total_optimizer_steps"] == "880" and p["plan.warmup_steps"] == "44"
    assert run.data.tags["doctor.findings"] == "none"
    assert len(client.get_metric_history(run.info.run_id, "doctor/grad_norm")) >= 880 // 25
    # the LR monitor logs per step
    assert len(client.get_metric_history(run.info.run_id, "lr/decay")) > 0
    # artifacts: the resolved config and both checkpoints under fixed names
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"config.yaml", "checkpoints", "confusion_matrix_val.png"} <= top
    ckpts = {a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")}
    assert ckpts == {"checkpoints/best.ckpt", "checkpoints/last.ckpt"}
    config_path = client.download_artifacts(run.info.run_id, "config.yaml", str(fitted / "dl"))
    config = yaml.safe_load(Path(config_path).read_text())
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.01
    assert config["trainer"]["gradient_clip_val"] == 1.0
    assert config["trainer"]["logger"]["init_args"]["experiment_name"] == "spiral_mlp"
    # local checkpoints, one directory per run
    local = fitted / "checkpoints" / "spiral_mlp" / run.info.run_id
    assert (local / "best.ckpt").is_file() and (local / "last.ckpt").is_file()
    assert (fitted / "mlflow.db").is_file() and (fitted / "mlruns").is_dir()
    # last.ckpt is the last epoch, not a copy of the best (Lightning 2.6's save_last=True does that with top_k=1)
    last = torch.load(local / "last.ckpt", weights_only=True)
    best = torch.load(local / "best.ckpt", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (39, 880)
    by_epoch = sorted(history, key=lambda m: m.step)
    best_epoch = max(range(len(by_epoch)), key=lambda i: (by_epoch[i].value, -i))
    assert best["epoch"] == best_epoch


@pytest.mark.slow
def test_validate_best_reproduces_the_best_logged_metric(fitted, monkeypatch):
    monkeypatch.chdir(fitted)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    fit_run = runs_of(fitted, "spiral_mlp")[0]
    client = mlflow_client(fitted)
    best_acc = max(m.value for m in client.get_metric_history(fit_run.info.run_id, "val/acc"))
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", "best"])
    runs = runs_of(fitted, "spiral_mlp")
    validate_run = runs[-1]
    assert validate_run.info.run_id != fit_run.info.run_id
    assert validate_run.data.tags["loopwise.stage"] == "validate"
    assert validate_run.data.tags["loopwise.ckpt_path"].endswith(f"{fit_run.info.run_id}/best.ckpt")
    assert validate_run.data.metrics["val/acc"] == pytest.approx(best_acc, abs=1e-6)
    # an explicit path and `last` work too
    last = fitted / "checkpoints" / "spiral_mlp" / fit_run.info.run_id / "last.ckpt"
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", str(last)])
    history = sorted(client.get_metric_history(fit_run.info.run_id, "val/acc"), key=lambda m: m.step)
    last_acc = history[-1].value
    assert runs_of(fitted, "spiral_mlp")[-1].data.metrics["val/acc"] == pytest.approx(last_acc, abs=1e-6)
    main(["validate", "-c", str(SPIRAL), "--ckpt_path", "last"])
    assert runs_of(fitted, "spiral_mlp")[-1].data.metrics["val/acc"] == pytest.approx(last_acc, abs=1e-6)
    assert all(r.info.status == "FINISHED" for r in runs_of(fitted, "spiral_mlp"))


@pytest.mark.slow
def test_test_and_predict_subcommands(fitted, monkeypatch):
    monkeypatch.chdir(fitted)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    main(["test", "-c", str(SPIRAL), "--ckpt_path", "best"])
    test_run = runs_of(fitted, "spiral_mlp")[-1]
    assert test_run.data.tags["loopwise.stage"] == "test"
    assert test_run.data.metrics["test/acc"] >= 0.95
    client = mlflow_client(fitted)
    assert "confusion_matrix_test.png" in {a.path for a in client.list_artifacts(test_run.info.run_id)}
    png = client.download_artifacts(test_run.info.run_id, "confusion_matrix_test.png", str(fitted / "cm"))
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = fitted / "preds.csv"
    main(["predict", "-c", str(SPIRAL), "--ckpt_path", "best", "--predictions_path", str(out)])
    rows = out.read_text().splitlines()
    # the sample's row in the generated data, the most likely class and one probability per class (no class names:
    # the class ids)
    assert rows[0] == "row,prediction,prob_0,prob_1,prob_2" and len(rows) == 1 + 201
    cells = [r.split(",") for r in rows[1:]]
    probs = torch.tensor([[float(v) for v in c[2:]] for c in cells])
    assert torch.allclose(probs.sum(1), torch.ones(201), atol=1e-5)
    assert [c[1] for c in cells] == [str(i) for i in probs.argmax(1).tolist()]
    from datamodules import SpiralDataModule

    data = SpiralDataModule(n_samples=2000, val_fraction=0.2, test_fraction=0.1, seed=0)
    data.setup()
    assert [int(c[0]) for c in cells] == data.split_rows["test"].tolist()
    # a second predict never overwrites the first file
    main(["predict", "-c", str(SPIRAL), "--ckpt_path", "best", "--predictions_path", str(out)])
    assert (fitted / "preds-1.csv").is_file() and out.read_text().splitlines() == rows


@pytest.mark.slow
def test_checkpoint_loads_in_a_fresh_process_with_same_outputs(fitted, tmp_path):
    from lightning_modules import ClassificationModule

    run = runs_of(fitted, "spiral_mlp")[0]
    ckpt = fitted / "checkpoints" / "spiral_mlp" / run.info.run_id / "best.ckpt"
    module = ClassificationModule.load_from_checkpoint(ckpt)
    module.eval()
    x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = module(x)
    torch.save(x, tmp_path / "x.pt")
    code = (
        "import sys, torch\n"
        "from lightning_modules import ClassificationModule\n"
        f"m = ClassificationModule.load_from_checkpoint({str(ckpt)!r})\n"
        "m.eval()\n"
        f"x = torch.load({str(tmp_path / 'x.pt')!r})\n"
        "with torch.no_grad():\n"
        f"    torch.save(m(x), {str(tmp_path / 'y.pt')!r})\n"
    )
    # a process that never imported loopwise (forked from one that imported only the libraries)
    out = preloaded_run([sys.executable, "-c", code], cwd=tmp_path, env=dict(os.environ), preload=LIBRARIES)
    assert out.returncode == 0, out.stderr[-3000:]
    assert torch.equal(torch.load(tmp_path / "y.pt"), expected)
    assert type(module.model).__name__ == "MLP" and module.hparams["num_classes"] == 3


@pytest.mark.slow
def test_second_run_with_another_lr_is_a_second_run(workdir, recwarn):
    args = ["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "2"]
    main(args)
    main([*args, "--model.init_args.optimizer.init_args.lr", "0.003"])
    # each run's folder is its own: Lightning's warning about a folder that is not empty said nothing on every fit
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]
    runs = runs_of(workdir, "spiral_mlp")
    assert [r.data.params["lr"] for r in runs] == ["0.01", "0.003"]
    assert all(r.info.status == "FINISHED" for r in runs)
    # one folder per run, beside the runs' lock files (.resume-locks, taken by every fit)
    dirs = sorted(p.name for p in (workdir / "checkpoints" / "spiral_mlp").iterdir() if not p.name.startswith("."))
    assert dirs == sorted(r.info.run_id for r in runs)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
@pytest.mark.parametrize("fragment", [None, *FRAGMENTS], ids=lambda p: p.name if p else "alone")
def test_every_config_runs_with_fast_dev_run(workdir, recipe, fragment, monkeypatch):
    if (REPO / "data").is_dir():
        (workdir / "data").symlink_to(REPO / "data")  # recipes name their data relative to the repository root
    args = ["fit", "-c", str(recipe), *hf_overrides(recipe)]  # a hub model: the tiny local stand-in, nothing downloaded
    ddp = False
    if fragment is not None:
        args += ["-c", str(fragment)]
        text = fragment.read_text()
        if "accelerator: gpu" in text and not torch.cuda.is_available():
            # the fragment is parsed and combined as written; the run itself goes to the CPU: bf16-mixed runs
            # with CPU autocast, and Lightning switches 16-mixed to bf16-mixed there with a warning
            args += ["--trainer.accelerator", "cpu"]
        ddp = "DDPStrategy" in text
    if ddp:
        # in-process DDP with one process: the launcher would re-run sys.argv (pytest) once per extra device, so
        # one device here (tests/end_to_end/test_ddp.py runs 2 processes through `python -m recipes`). The launcher exports
        # MASTER_ADDR/MASTER_PORT/... to os.environ and the gloo group outlives the run: both are undone below,
        # or a later DDP subprocess would inherit LOCAL_RANK and believe its processes were created externally.
        for key in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK"):
            monkeypatch.delenv(key, raising=False)
        args += ["--trainer.devices", "1"]
    try:
        main([*args, "--trainer.fast_dev_run", "1"])
    finally:
        if ddp and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    # fast_dev_run swaps loggers for a dummy: nothing is tracked
    assert runs_of(workdir, recipe.stem) == []


def test_gpu_fragment_without_gpu_says_so(workdir, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU; the message is for machines without one")
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(SPIRAL), "-c", str(CONFIGS / "trainer" / "gpu-bf16.yaml")])
    assert exc.value.code == 2
    assert "torch sees no CUDA device" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data.init_args.bogus", "3"], "Option 'bogus' is not accepted"),
        (["--trainer.max_epochs", "many"], "trainer.max_epochs"),
        (["--data.init_args.batch_size", "-5"], "batch_size must be >= 1, got -5"),
        (["--data.init_args.n_classes", "1"], "n_classes must be >= 2, got 1"),
        (["--model.init_args.num_classes", "4"], "model.init_args.num_classes is 4 in the config, but SpiralDataModule has num_classes 3"),
        (["--model.init_args.model.init_args.in_features", "5"], "in_features is 5 in the config, but SpiralDataModule has in_features 2"),
        (["--ckpt_path", "missing.ckpt"], "checkpoint file not found"),
    ],
)
def test_bad_input_gives_a_clear_message_and_leaves_no_running_run(workdir, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", *extra])
    assert exc.value.code != 0
    assert message in capsys.readouterr().err
    assert all(r.info.status != "RUNNING" for r in runs_of(workdir, "spiral_mlp"))


def test_a_failure_inside_fit_marks_the_run_failed(workdir, capsys):
    from recipes.doctor.non_finite import NonFiniteError

    with pytest.raises(NonFiniteError):  # an error during training keeps its traceback
        # a learning rate this large makes the loss non-finite after the first steps: the doctor stops the run
        main(["fit", "-c", str(SPIRAL), "--model.init_args.optimizer.init_args.lr", "1e30"])
    runs = runs_of(workdir, "spiral_mlp")
    assert [r.info.status for r in runs] == ["FAILED"]


def test_early_stopping_when_the_recipe_asks(workdir):
    # lr 0: val/acc never improves after the first epoch, so patience 2 stops after 3 epochs of 40
    main(["fit", "-c", str(SPIRAL), "--early_stopping_patience", "2",
          "--model.init_args.optimizer.init_args.lr", "0.0"])
    run = runs_of(workdir, "spiral_mlp")[0]
    assert run.info.status == "FINISHED"
    history = mlflow_client(workdir).get_metric_history(run.info.run_id, "val/acc")
    assert len(history) == 3 and run.data.params["max_epochs"] == "40"


def test_missing_config_file_and_unknown_top_level_key(workdir, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", "does_not_exist.yaml"])
    assert exc.value.code != 0 and "does_not_exist.yaml" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPIRAL.read_text() + "\nlearning_rate: 0.1\n")
    with pytest.raises(SystemExit) as exc:
        main(["fit", "-c", str(bad)])
    assert exc.value.code != 0 and "learning_rate" in capsys.readouterr().err
    assert runs_of(workdir, "spiral_mlp") == [] and runs_of(workdir, "bad") == []


def test_validate_best_before_any_fit_is_a_clear_error(workdir, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["validate", "-c", str(SPIRAL), "--ckpt_path", "best"])
    assert exc.value.code != 0
    assert "no best.ckpt for experiment 'spiral_mlp'" in capsys.readouterr().err


@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_tracking_uri_is_read_at_run_time(workdir, monkeypatch):
    other = workdir / "elsewhere"
    other.mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other / 'team.db'}")
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2"])
    assert not (workdir / "mlflow.db").exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{other / 'team.db'}")
    exp = client.get_experiment_by_name("spiral_mlp")
    assert [r.info.status for r in client.search_runs([exp.experiment_id])] == ["FINISHED"]


def test_python_dash_m_recipes_is_the_same_command(workdir):
    out = preloaded_run([sys.executable, "-m", "recipes", "fit", "--help"], cwd=REPO, env=dict(os.environ))
    assert out.returncode == 0
    assert "--early_stopping_patience" in out.stdout and "--ckpt_path" in out.stdout


def test_ckpt_path_help_is_loopwise_s_own(workdir, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")
    for stage in ("fit", "validate", "test", "predict"):
        with pytest.raises(SystemExit) as exc:  # in this process: the help is the same, without a start-up
            main([stage, "--help"])
        assert exc.value.code == 0
        help_text = " ".join(capsys.readouterr().out.split())
        assert "``best`` (the best best.ckpt among this recipe's finished fit runs on this data)" in help_text
        assert "``mlflow:<run id>/best|last``" in help_text
        assert "hpc" not in help_text and "registry:model-name" not in help_text  # Lightning's stock text


def test_recipes_help_lists_every_command(workdir):
    out = preloaded_run([sys.executable, "-m", "recipes", "--help"], cwd=REPO, env=dict(os.environ))
    assert out.returncode == 0
    listed = [line.split()[0] for line in out.stdout.split("Each takes --help.")[0].splitlines()[1:] if line.strip()]
    assert listed == ["fit", "validate", "test", "predict", "compare", "sweep", "sync", "export", "pack"]
    assert "{fit,validate,test,predict}" in out.stdout  # LightningCLI's own help follows


def test_a_command_builds_the_parser_of_its_own_subcommand_only(capsys):
    """Each subcommand's parser is built from the trainer's, model's and data module's signatures (about 70 ms of a
    200 ms fast_dev_run here): `recipes fit ...` builds fit's alone; `recipes --help` and an unknown first word get
    all four, so the help and jsonargparse's "choose from" list stay whole."""
    from types import SimpleNamespace

    from recipes.run.recipes_cli import RecipesCLI

    def chosen(*args: str) -> list[str]:
        return list(RecipesCLI.subcommands(SimpleNamespace(command_args=list(args))))  # type: ignore[arg-type]

    assert chosen("fit", "-c", "x.yaml") == ["fit"] and chosen("predict") == ["predict"]
    assert chosen("--help") == chosen() == chosen("fitt") == ["fit", "validate", "test", "predict"]
    with pytest.raises(SystemExit):  # (`recipes fitt` stops before LightningCLI: tests/test_one_command_line.py)
        RecipesCLI(args=["fitt"])
    assert "invalid choice: 'fitt' (choose from 'fit', 'validate', 'test', 'predict')" in capsys.readouterr().err
