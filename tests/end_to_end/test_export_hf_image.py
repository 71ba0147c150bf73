"""Issue 33's "Done means", end to end: a locally built ViT, ResNet and ConvNeXt (with the image processors such hub
models ship) fine-tuned through ``configs/image_finetune_hf.yaml`` with only ``name_or_path``, ``image_processor`` and
``root`` overridden; ``recipes predict`` labels a folder of new images (another size than the training images) with
class names; ``recipes export`` writes them with ``save_pretrained``, and in a FRESH process the export loads back
into ``transformers`` (``AutoModelForImageClassification`` + ``AutoImageProcessor``) and the run's MLflow model
(pyfunc on image paths) loads back too, both with the probabilities ``recipes predict`` wrote and the class names as
labels. A fourth fit uses the data module's own preprocessing (no processor: export writes a ``ViTImageProcessor`` of
it). Tiny local models, nothing downloaded."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from recipes.cli import main
from recipes.predict.model_logging import MODEL_TAG
from tests.preloaded_python import LIBRARIES, preloaded_run
from tests.conftest import CONFIGS, REPO, recipes_env, runs_of, working_directory
from tests.hf_image_models import DIGIT_NAMES, build_tiny_convnext, build_tiny_resnet, build_tiny_vit, digits_folder

pytestmark = pytest.mark.usefixtures("one_thread")
CLASSES = sorted(DIGIT_NAMES[:4])  # the class folders, sorted: the data's class names

FRESH = """
import json, sys
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoModelForImageClassification
directory, paths = sys.argv[1], json.loads(sys.argv[2])
model = AutoModelForImageClassification.from_pretrained(directory).eval()
processor = AutoImageProcessor.from_pretrained(directory)
images = [Image.open(path) for path in paths]
with torch.no_grad():
    logits = model(**processor(images=images, return_tensors="pt")).logits
out = {"probs": logits.double().softmax(dim=1).tolist(), "id2label": model.config.id2label,
       "processor": type(processor).__name__}
if len(sys.argv) > 3:  # the run's MLflow model on the same image paths
    import mlflow, pandas as pd
    mlflow.set_tracking_uri(sys.argv[3])
    table = mlflow.pyfunc.load_model(sys.argv[4]).predict(pd.DataFrame({"path": paths}))
    out["mlflow"] = table[[c for c in table.columns if c.startswith("prob_")]].astype(float).values.tolist()
    out["mlflow_prediction"] = table["prediction"].astype(str).tolist()
print(json.dumps(out))
"""
RECIPE = CONFIGS / "image_finetune_hf.yaml"
FAMILIES = {"vit": build_tiny_vit, "resnet": build_tiny_resnet, "convnext": build_tiny_convnext}


def write_recipe(directory: Path, model: Path, root: Path, **data) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {"max_epochs": 2, "limit_train_batches": 3, "log_every_n_steps": 1},
        "model": {"class_path": "lightning_modules.ClassificationModule", "init_args": {
            "model": {"class_path": "lightning_modules.models.HFImageClassifier",
                      "init_args": {"name_or_path": str(model)}},
            "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.003}}}},
        "data": {"class_path": "datamodules.ImageFolderDataModule", "init_args": {
            "root": str(root), "batch_size": 8, "val_fraction": 0.25, "seed": 0, **data}},
    }
    path = directory / "export_recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module", params=["own_preprocessing", "resnet", pytest.param("vit", marks=pytest.mark.slow),
                                        pytest.param("convnext", marks=pytest.mark.slow)])
def exported(request, clean_workdir, tmp_path_factory) -> dict:
    """One fit per family (the image recipe itself, three overrides) or with the data module's own preprocessing,
    then ``recipes predict`` of a folder of new images (another size than the training images: the resize plays its
    part) and ``recipes export``."""
    with clean_workdir(f"export_{request.param}") as directory:
        root = digits_folder(directory / "digits", digits=range(4), per_class=10, names=True)
        new = digits_folder(directory / "new", digits=range(4), per_class=2, size=40, seed=1)
        if request.param == "own_preprocessing":
            recipe = write_recipe(directory, build_tiny_vit(directory / "vit"), root, image_size=32)
            args, name = ["-c", str(recipe)], "export_recipe"
        else:
            model = FAMILIES[request.param](directory / "pretrained")
            args = ["-c", str(RECIPE), "--model.init_args.model.init_args.name_or_path", str(model),
                    "--data.init_args.image_processor", str(model), "--data.init_args.root", str(root)]
            recipe, name = RECIPE, "image_finetune_hf"
        main(["fit", *args])
        main(["predict", *args, "--ckpt_path", "best", "--data.init_args.predict_path", str(new),
              "--predictions_path", "predictions.csv"])
        with pytest.raises(SystemExit) as done:  # a command of its own, as compare and sweep: exits with its code
            main(["export", *args, "--ckpt_path", "best", "--export_dir", "exported"])
        assert done.value.code == 0
        with (directory / "predictions.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        (run,) = [r for r in runs_of(directory, name) if MODEL_TAG in r.data.tags]  # the fit's logged model
        return {"directory": directory, "recipe": recipe, "rows": rows, "export": directory / "exported",
                "kind": request.param, "model_uri": run.data.tags[MODEL_TAG]}


def test_the_export_reloads_in_transformers_with_the_predictions_of_recipes_predict(exported):
    rows, export = exported["rows"], exported["export"]
    assert sorted(p.name for p in export.iterdir()) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    paths = [str(Path(exported["directory"], row["path"])) if not Path(row["path"]).is_absolute() else row["path"]
             for row in rows]
    assert len(paths) == 8 and all(Path(p).is_file() for p in paths)
    store = f"sqlite:///{exported['directory'] / 'mlflow.db'}"
    # a process that never imported loopwise (forked from one that imported only the libraries)
    out = preloaded_run([sys.executable, "-c", FRESH, str(export), json.dumps(paths), store, exported["model_uri"]],
                        env={**recipes_env(), "HF_HUB_OFFLINE": "1"}, cwd=REPO, timeout=300, preload=LIBRARIES)
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    assert fresh["id2label"] == {str(i): name for i, name in enumerate(CLASSES)}
    predicted = torch.tensor([[float(row[f"prob_{name}"]) for name in CLASSES] for row in rows], dtype=torch.float64)
    loaded = torch.tensor(fresh["probs"], dtype=torch.float64)
    print(f"{exported['kind']}: largest difference {float((loaded - predicted).abs().max()):.2e}")
    assert torch.allclose(loaded, predicted, atol=1e-5, rtol=0)
    assert [row["prediction"] for row in rows] == [CLASSES[i] for i in loaded.argmax(dim=1).tolist()]
    assert set(row["prediction"] for row in rows) <= set(CLASSES)  # class names, not ids
    expected = "ConvNextImageProcessor" if exported["kind"] in ("resnet", "convnext") else "ViTImageProcessor"
    assert fresh["processor"].startswith(expected)
    # the run's MLflow model, loaded in the same fresh process, on the image paths: the same table
    served = torch.tensor(fresh["mlflow"], dtype=torch.float64)
    print(f"{exported['kind']}: MLflow model, largest difference {float((served - predicted).abs().max()):.2e}")
    assert torch.allclose(served, predicted, atol=1e-5, rtol=0)
    assert fresh["mlflow_prediction"] == [row["prediction"] for row in rows]


def test_bad_exports_are_one_line_each(exported, capsys):
    if exported["kind"] != "own_preprocessing":
        pytest.skip("the cases need one fit")
    with working_directory(exported["directory"]):  # no MLFLOW_TRACKING_URI another test's MLflow left exported
        bad_exports_are_one_line_each(exported, capsys)


def bad_exports_are_one_line_each(exported, capsys) -> None:
    recipe = str(exported["recipe"])
    cases = [
        (["--ckpt_path", "best", "--export_dir", "exported"],
         "recipes: error: --export_dir exported already exists and is not an empty directory: name a new directory "
         "(nothing there is overwritten)"),
        (["--export_dir", "elsewhere"],
         "recipes: error: export needs --ckpt_path best|last|run:<run id>/best|mlflow:<run id>/best|<file>"),
        (["--ckpt_path", "none", "--export_dir", "elsewhere"],
         "recipes: error: export needs --ckpt_path best|last|run:<run id>/best|mlflow:<run id>/best|<file>"),
        (["--ckpt_path", "best"], "recipes: error: export needs --export_dir DIR: the new directory to write the network to"),
    ]
    for args, line in cases:
        with pytest.raises(SystemExit) as exc:
            main(["export", "-c", recipe, *args])
        assert exc.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1] == line
    assert not (exported["directory"] / "elsewhere").exists()
    # a checkpoint file, as every --ckpt_path form predict takes: the same weights as `best`
    (best,) = Path("checkpoints").rglob("best.ckpt")
    with pytest.raises(SystemExit) as done:
        main(["export", "-c", recipe, "--ckpt_path", str(best), "--export_dir", "by_file"])
    assert done.value.code == 0
    from safetensors.torch import load_file

    by_file, by_alias = load_file("by_file/model.safetensors"), load_file("exported/model.safetensors")
    assert by_file.keys() == by_alias.keys() and all(torch.equal(by_file[k], by_alias[k]) for k in by_file)
