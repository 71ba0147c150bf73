"""A checkpoint or a tracker artifact is data: the class paths it holds are compared as text, never imported.

``marker_mod`` is a real, importable module (``tmp_path`` is on ``sys.path``) that writes a marker file and prints a
line when imported, so an import that happened would leave the marker (and break ``--format json``).
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import torch
import yaml

from recipes.cli import main
from recipes.compare.command import main as compare_main
from tests.conftest import SPIRAL, mlflow_client, runs_of

TINY = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.limit_test_batches", "1"]
FOREIGN = "marker_mod.Foo"
MARKER_MODULE = """\
from pathlib import Path

print("marker_mod was imported")
Path({marker!r}).write_text("imported")


class Foo:
    pass
"""


@pytest.fixture(scope="module")
def fitted(clean_workdir) -> Path:
    """One tiny spiral fit (its own store): ``checkpoints/spiral_mlp/<run>/best.ckpt`` and the run's ``config.yaml``."""
    with clean_workdir("noimport") as directory:
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "1", "--mlflow_model", "false"])
    return directory


@pytest.fixture
def marker(fitted, tmp_path, monkeypatch) -> Path:
    """Work in the fitted directory with ``marker_mod`` importable; returns the file its import would write."""
    monkeypatch.chdir(fitted)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    modules = tmp_path / "modules"
    modules.mkdir()
    path = tmp_path / "marker_mod_was_imported"
    (modules / "marker_mod.py").write_text(MARKER_MODULE.format(marker=str(path)))
    monkeypatch.syspath_prepend(str(modules))
    sys.modules.pop("marker_mod", None)
    importlib.invalidate_caches()
    yield path
    sys.modules.pop("marker_mod", None)  # an import in a failing run must not hide one in the next test


def doctored_checkpoint(fitted: Path, where: str, target: Path) -> Path:
    """A copy of the fit's ``best.ckpt`` whose hyperparameters name ``marker_mod.Foo`` at ``where``."""
    (best,) = fitted.glob("checkpoints/spiral_mlp/*/best.ckpt")
    ckpt = torch.load(best, weights_only=True)
    hparams = ckpt["hyper_parameters"]
    if where == "_class_path":
        hparams["_class_path"] = FOREIGN
    elif where == "model.class_path":
        hparams["model"]["class_path"] = FOREIGN
    elif where == "optimizer":  # a plain import path where the task takes a callable
        hparams["optimizer"] = FOREIGN
    else:
        raise ValueError(where)
    torch.save(ckpt, target)
    return target


CASES = [(stage, where) for where in ("_class_path", "model.class_path") for stage in ("validate", "test", "predict", "fit")]
CASES.append(("validate", "optimizer"))


@pytest.mark.parametrize("stage, where", CASES, ids=[f"{stage}-{where}" for stage, where in CASES])
def test_a_checkpoint_never_chooses_what_is_imported(fitted, marker, tmp_path, capsys, stage, where):
    path = doctored_checkpoint(fitted, where, tmp_path / "doctored.ckpt")
    runs_before = len(runs_of(fitted, "spiral_mlp"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main([stage, "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2", "--ckpt_path", str(path)])
    assert not marker.exists(), "marker_mod was imported"
    assert stop.value.code == 2
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("recipes: error:")]
    assert len(errors) == 1, out.err
    assert errors[0].startswith(f"recipes: error: --ckpt_path {path}: its hyperparameters name ")
    assert f"'{FOREIGN}' at {where}, but the config " in errors[0]
    assert "marker_mod was imported" not in out.out
    assert len(runs_of(fitted, "spiral_mlp")) == runs_before  # refused before any run was made


def test_the_message_names_the_config_class_and_the_fix(fitted, marker, tmp_path, capsys):
    path = doctored_checkpoint(fitted, "model.class_path", tmp_path / "doctored.ckpt")
    with pytest.raises(SystemExit):
        main(["validate", "-c", str(SPIRAL), "--ckpt_path", str(path)])
    err = capsys.readouterr().err.strip()
    assert err == (
        f"recipes: error: --ckpt_path {path}: its hyperparameters name the class '{FOREIGN}' at model.class_path, "
        "but the config names 'lightning_modules.models.MLP' there (model.init_args.model.class_path); a checkpoint "
        "never chooses what is imported: use the recipe it was trained with, or, if you trust it, name it in your "
        f"config yourself (--model.init_args.model.class_path {FOREIGN})"
    )
    assert not marker.exists()


def test_an_unchanged_checkpoint_still_validates(fitted, marker, capsys):
    (best,) = fitted.glob("checkpoints/spiral_mlp/*/best.ckpt")
    main(["validate", "-c", str(SPIRAL), *TINY, "--ckpt_path", str(best)])  # short names in the YAML, full ones saved
    assert "recipes: error" not in capsys.readouterr().err
    assert runs_of(fitted, "spiral_mlp")[-1].data.tags["loopwise.stage"] == "validate"


def run_config_file(fitted: Path) -> tuple[str, Path]:
    """The fit run's id and the local file of its ``config.yaml`` artifact in the embedded store."""
    fit_run = next(r for r in runs_of(fitted, "spiral_mlp") if r.data.tags.get("loopwise.stage") == "fit")
    run = mlflow_client(fitted).get_run(fit_run.info.run_id)
    root = urlparse(run.info.artifact_uri)
    directory = Path(unquote(root.path)) if root.scheme == "file" else fitted / run.info.artifact_uri
    return fit_run.info.run_id, directory / "config.yaml"


def test_compare_reads_a_runs_config_as_text(fitted, marker, capsys):
    run_id, config_file = run_config_file(fitted)
    original = config_file.read_text()
    config = yaml.safe_load(original)
    config["model"]["class_path"] = FOREIGN
    config["model"]["init_args"].pop("monitor", None)  # so the class would be asked for its default monitor
    config_file.write_text(yaml.safe_dump(config))
    try:
        capsys.readouterr()
        # fit runs only (the default): the doctored run is the newest listed one, whose config names the metric
        assert compare_main(["--experiment", "spiral_mlp", "--format", "json"]) == 0
        rows = json.loads(capsys.readouterr().out)  # nothing but the JSON on stdout
        assert [row["id"] for row in rows] == [run_id]
        assert compare_main(["--experiment", "spiral_mlp"]) == 0
        assert "marker_mod was imported" not in capsys.readouterr().out
        assert not marker.exists(), "marker_mod was imported"
    finally:
        config_file.write_text(original)


def test_the_comparison_is_by_place_and_text():
    from jsonargparse import Namespace

    from recipes.checkpoints.classes import foreign_class_paths

    mlp = Namespace(class_path="lightning_modules.models.MLP", init_args=Namespace(hidden_sizes=[8]))
    config = Namespace(
        class_path="lightning_modules.ClassificationModule",
        init_args=Namespace(model=mlp, optimizer=torch.optim.AdamW, extra=[Namespace(class_path="a.B")], name="x"),
    )
    same = {
        "_class_path": "lightning_modules.ClassificationModule",
        "_instantiator": "lightning.pytorch.cli.instantiate_module",  # LightningCLI drops it unparsed
        "model": {"class_path": "lightning_modules.models.MLP", "init_args": {"hidden_sizes": [64]}},
        "optimizer": "torch.optim.AdamW",  # another path of the same, already imported class
        "extra": [{"class_path": "a.B"}],
        "name": "other",  # plain values may differ: the checkpoint's win, as before
    }
    assert foreign_class_paths(same, config) == []
    doctored = {
        **same,
        "model": "ConvNet",  # a bare name where the config names a class
        "optimizer": {"class_path": "torch.optim.SGD"},
        "extra": [{"class_path": "a.C"}, {"class_path": "a.B"}],
        "name": "os.system",
    }
    found = [(m.place, m.config_place, m.saved, m.configured) for m in foreign_class_paths(doctored, config)]
    assert found == [
        ("model", "model.init_args.model", "ConvNet", "lightning_modules.models.MLP"),
        ("optimizer.class_path", "model.init_args.optimizer.class_path", "torch.optim.SGD", "torch.optim.adamw.AdamW"),
        ("extra.0.class_path", "model.init_args.extra.0.class_path", "a.C", "a.B"),
        ("extra.1.class_path", "model.init_args.extra.1.class_path", "a.B", None),
        ("name", "model.init_args.name", "os.system", "x"),
    ]
    assert [m.place for m in foreign_class_paths({"_class_path": "this.Foo"}, None)] == ["_class_path"]
