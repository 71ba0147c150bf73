"""An ``init_from`` file is data: read by the weights-only loader and nothing else, never parsed as a config.

The adversary's files: a text file naming a class (``class_path: <module>.X``: jsonargparse used to read it as a
sub-config of ``init_from`` and import the module), a text file that redirects ``init_from`` to another file, an
empty file (read as an empty config: no ``init_from`` at all), integer and boolean tensors of the right shapes, and a
weight that is NaN or inf. Each is one ``recipes: error:`` line before any run, naming the file (and the tensor).
``init_marker`` is a real, importable module that writes a marker file when imported.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.cli import LightningCLI

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.fine_tuning.initial_weights import InitialWeights
from lightning_modules.models import MLP
from recipes.cli import main
from tests.conftest import SPIRAL, runs_of

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
        "--data.init_args.n_samples", "300", "--mlflow_model", "false"]
MARKER_MODULE = """\
from pathlib import Path

print("init_marker was imported")
Path({marker!r}).write_text("imported")


class X:
    def __init__(self, *args, **kwargs):
        Path({marker!r}).write_text("built")
"""
#: the adversary's text files, by name
TEXT_FILES = {
    "pretrained.pt": "class_path: init_marker.X\n",
    "redirect.pt": "path: good.pt\nexclude: [net.4]\nstrict: false\n",
    "subclass.pt": "class_path: init_marker.X\ninit_args: {}\n",
}


def spiral_network() -> MLP:
    """The spiral recipe's network (2-128-128-3), whose keys and shapes an adversary's file would match."""
    return MLP(2, 3, [128, 128])


@pytest.fixture
def marker(workdir, monkeypatch) -> Path:
    """``init_marker`` importable from ``workdir``; returns the file its import would write."""
    modules = workdir / "modules"
    modules.mkdir()
    path = workdir / "init_marker_was_imported"
    (modules / "init_marker.py").write_text(MARKER_MODULE.format(marker=str(path)))
    monkeypatch.syspath_prepend(str(modules))
    sys.modules.pop("init_marker", None)
    importlib.invalidate_caches()
    torch.save(spiral_network().state_dict(), workdir / "good.pt")  # what the redirecting file points at
    for name, text in TEXT_FILES.items():
        (workdir / name).write_text(text)
    (workdir / "empty.pt").write_bytes(b"")
    yield path
    sys.modules.pop("init_marker", None)


def refused(capsys, args: list[str]) -> str:
    """Run ``recipes`` expecting exit 2; returns its one ``recipes: error:`` line (there must be one only)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(args)
    out = capsys.readouterr()
    errors = [line for line in out.err.splitlines() if line.startswith("recipes: error:")]
    assert stop.value.code == 2 and len(errors) == 1, out.err[-3000:]
    assert "init_marker was imported" not in out.out
    return errors[0]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("pretrained.pt", "init_from: pretrained.pt is not a weights file"),
        ("redirect.pt", "init_from: redirect.pt is not a weights file"),
        ("empty.pt", "init_from: empty.pt is empty (0 bytes)"),
    ],
    ids=["class_path_text", "redirecting_text", "empty"],
)
def test_a_text_or_empty_init_from_file_runs_no_code_and_is_one_line_before_any_run(marker, workdir, capsys, name,
                                                                                      message):
    try:
        line = refused(capsys, ["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from", name])
    finally:
        assert not marker.exists(), "a module named inside the weights file was imported"
    assert line.startswith(f"recipes: error: {message}"), line
    assert "torch.save(network.state_dict(), path)" in line  # the fix
    assert "good.pt" not in line  # the redirect was never followed
    assert runs_of(workdir, "spiral_mlp") == []  # refused before any run was made


def test_the_long_form_path_is_read_by_the_weights_loader_too(marker, workdir, capsys):
    line = refused(capsys, ["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from",
                            "{path: pretrained.pt, strict: false}"])
    assert not marker.exists()
    assert line.startswith("recipes: error: init_from: pretrained.pt is not a weights file"), line


@pytest.mark.slow
def test_the_long_form_still_maps_keys(workdir, capsys):
    torch.manual_seed(0)
    source = spiral_network()
    torch.save(source.state_dict(), workdir / "good.pt")
    main(["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from", "{path: good.pt, exclude: [net.4], strict: true}"])
    out = capsys.readouterr().out
    assert "recipes: init_from good.pt: 4 tensors (16,896 parameters) loaded into the network; " \
           "2 excluded: net.4.weight, net.4.bias" in out
    run = runs_of(workdir, "spiral_mlp")[0]
    assert run.data.params["init_from.path"] == "good.pt" and run.data.params["init_from.exclude"] == '["net.4"]'


def plain_cli(workdir: Path, init_from: str) -> LightningCLI:
    """Lightning's own CLI (no ``recipes``) with a task whose ``init_from`` is ``init_from``, classes built."""
    (workdir / "plain.yaml").write_text(
        "trainer: {logger: false, enable_checkpointing: false, enable_progress_bar: false, max_epochs: 1}\n"
        "model:\n  model: {class_path: lightning_modules.models.MLP, "
        "init_args: {in_features: 2, out_features: 3, hidden_sizes: [128, 128]}}\n"
        f"  num_classes: 3\n  init_from: {init_from}\n"
        "data: {n_samples: 200, batch_size: 50}\n"
    )
    return LightningCLI(ClassificationModule, SpiralDataModule, run=False, save_config_callback=None,
                        args=["-c", str(workdir / "plain.yaml")])


@pytest.mark.parametrize("name", sorted(TEXT_FILES) + ["empty.pt"])
def test_a_plain_lightning_cli_never_parses_the_file_either(marker, workdir, name):
    cli = plain_cli(workdir, name)
    assert not marker.exists(), "a module named inside the weights file was imported"
    assert cli.config.model.init_from == name  # the text, not the file's content
    assert cli.model.fine_tuning.initial_weights.path == name
    with pytest.raises(ValueError, match=rf"^init_from: {name} is (not a weights file|empty)") as err:
        cli.model.load_initial_weights()
    assert "\n" not in str(err.value)


def load_into_spiral_network(path: Path, **options) -> ClassificationModule:
    task = ClassificationModule(spiral_network(), num_classes=3, init_from=InitialWeights(str(path), **options))
    task.load_initial_weights()
    return task


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.int32, torch.uint8],
                         ids=["int64", "bool", "int32", "uint8"])
def test_integer_and_boolean_tensors_are_not_weights(tmp_path, dtype):
    state = {k: torch.ones_like(v, dtype=dtype) for k, v in spiral_network().state_dict().items()}
    torch.save(state, tmp_path / "ints.pt")
    kind = str(dtype).removeprefix("torch.")
    with pytest.raises(ValueError) as err:
        load_into_spiral_network(tmp_path / "ints.pt")
    assert str(err.value) == (
        f"init_from: {tmp_path / 'ints.pt'}: net.0.weight is {kind} in the file, float32 in the network (and 5 more "
        "tensors); integer and boolean tensors are not weights: save the network's own tensors "
        "(torch.save(network.state_dict(), path))"
    )
    with pytest.raises(ValueError, match="is .* in the file, float32 in the network"):  # strict: false too
        load_into_spiral_network(tmp_path / "ints.pt", strict=False)


def test_an_integer_tensor_loads_where_the_network_keeps_integers(tmp_path):
    torch.manual_seed(0)
    source = MLP(2, 3, [8], norm="batch")
    source.net[1].num_batches_tracked.fill_(7)  # an int64 buffer in the network: loaded as the file has it
    torch.save(source.state_dict(), tmp_path / "bn.pt")
    task = ClassificationModule(MLP(2, 3, [8], norm="batch"), num_classes=3, init_from=str(tmp_path / "bn.pt"))
    report = task.load_initial_weights()
    assert report.complete and int(task.model.net[1].num_batches_tracked) == 7


def test_recipes_refuses_int64_weights_in_one_line(workdir, capsys):
    state = {k: torch.randint(-3, 3, v.shape) for k, v in spiral_network().state_dict().items()}
    torch.save(state, workdir / "ints.pt")
    line = refused(capsys, ["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from", "ints.pt"])
    assert line.startswith("recipes: error: init_from: ints.pt: net.0.weight is int64 in the file, float32 in the "
                           "network"), line
    assert runs_of(workdir, "spiral_mlp") == []


@pytest.mark.parametrize(("value", "counted"), [(float("nan"), "2 NaN"), (float("inf"), "2 inf"),
                                                (float("-inf"), "2 inf")], ids=["nan", "inf", "minus_inf"])
def test_a_weight_that_is_not_finite_is_one_line_naming_file_and_tensor(tmp_path, value, counted):
    state = spiral_network().state_dict()
    state["net.2.weight"][3, :2] = value
    torch.save(state, tmp_path / "broken.pt")
    with pytest.raises(ValueError) as err:
        load_into_spiral_network(tmp_path / "broken.pt", strict=False)
    assert str(err.value) == (
        f"init_from: {tmp_path / 'broken.pt'}: net.2.weight holds {counted} value(s) of 16,384; the file's weights "
        "are broken (a diverged run?): start from another file, such as an earlier checkpoint"
    )


def test_recipes_names_the_nan_tensor_before_training_not_the_learning_rate(workdir, capsys):
    state = spiral_network().state_dict()
    state["net.4.bias"][1] = float("nan")
    torch.save({"state_dict": {f"model.{k}": v for k, v in state.items()}}, workdir / "diverged.ckpt")
    line = refused(capsys, ["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from", "diverged.ckpt"])
    assert line == ("recipes: error: init_from: diverged.ckpt: net.4.bias holds 1 NaN value(s) of 3; the file's "
                    "weights are broken (a diverged run?): start from another file, such as an earlier checkpoint")
    assert runs_of(workdir, "spiral_mlp") == []


def test_an_excluded_broken_tensor_is_not_read(tmp_path):
    state = spiral_network().state_dict()
    state["net.4.weight"].fill_(float("nan"))  # the head left out: its values never reach the network
    torch.save(state, tmp_path / "head.pt")
    task = load_into_spiral_network(tmp_path / "head.pt", exclude=["net.4"])
    assert task.weights_report.excluded == ["net.4.weight", "net.4.bias"]
    assert torch.isfinite(task.model.net[4].weight).all()


@pytest.mark.slow
@pytest.mark.parametrize("init_from", ["good.pt", "{path: good.pt, exclude: [net.4]}"], ids=["short", "long"])
def test_a_fine_tuned_checkpoint_evaluates_without_naming_the_initial_file_again(workdir, capsys, init_from):
    torch.save(spiral_network().state_dict(), workdir / "good.pt")
    main(["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from", init_from])
    (workdir / "good.pt").unlink()  # the checkpoint holds every weight: the initial file is not read again
    capsys.readouterr()
    main(["test", "-c", str(SPIRAL), "--data.init_args.n_samples", "300", "--trainer.limit_test_batches", "1",
          "--ckpt_path", "best"])  # "good.pt" in its hyperparameters is a file name, not an import path
    assert "recipes: error" not in capsys.readouterr().err
    assert runs_of(workdir, "spiral_mlp")[-1].data.metrics["test/acc"] >= 0


@pytest.mark.slow
def test_a_class_path_under_init_from_in_a_checkpoint_imports_nothing(marker, workdir, capsys):
    main(["fit", "-c", str(SPIRAL), *TINY, "--model.init_args.init_from", "good.pt"])
    (best,) = workdir.glob("checkpoints/spiral_mlp/*/best.ckpt")
    ckpt = torch.load(best, weights_only=True)
    ckpt["hyper_parameters"]["init_from"] = {"class_path": "init_marker.X", "init_args": {}}
    torch.save(ckpt, workdir / "doctored.ckpt")
    with pytest.raises(SystemExit) as stop:
        main(["test", "-c", str(SPIRAL), "--data.init_args.n_samples", "300", "--ckpt_path", "doctored.ckpt"])
    assert stop.value.code == 2 and not marker.exists()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("recipes: error:")]
    assert errors == [
        f"recipes: error: --ckpt_path {workdir / 'doctored.ckpt'}: its hyperparameters name the class 'init_marker.X' at "
        "init_from.class_path, where a task takes a file name or a mapping, never a class; a checkpoint never chooses "
        "what is imported: use a checkpoint that the recipes wrote"
    ]


def test_a_truncated_weights_file_is_one_line(tmp_path):
    torch.save(spiral_network().state_dict(), tmp_path / "whole.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "whole.pt").read_bytes()[:4000])  # a copy that stopped half-way
    with pytest.raises(ValueError) as err:
        load_into_spiral_network(tmp_path / "cut.pt")
    assert str(err.value) == (
        f"init_from: {tmp_path / 'cut.pt'} is not a weights file (a damaged or truncated zip archive: copy or save it "
        "again); save the weights with torch.save(network.state_dict(), path)"
    )
