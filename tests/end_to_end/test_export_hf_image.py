"""``recipes export`` (issue 33 point 5): a Hugging Face image classifier fine-tuned through a recipe on a folder of
digits, exported with ``save_pretrained``, loads back into ``transformers`` in a fresh process
(``AutoModelForImageClassification`` + ``AutoImageProcessor``) with the probabilities ``recipes predict`` wrote and
the class names as ``id2label``: with the data module's own preprocessing (a ViT: bilinear resize, train mean/std)
and with the model's image processor (a ConvNeXt and a ResNet: shortest edge, crop_pct center crop). Tiny local models, nothing
downloaded."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from recipes.cli import main
from tests.conftest import REPO, recipes_env
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
print(json.dumps({"probs": logits.double().softmax(dim=1).tolist(), "id2label": model.config.id2label,
                  "processor": type(processor).__name__}))
"""


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


@pytest.fixture(scope="module", params=["own_preprocessing", pytest.param("image_processor", marks=pytest.mark.slow),
                                        pytest.param("resnet_image_processor", marks=pytest.mark.slow)])
def exported(request, clean_workdir, tmp_path_factory) -> dict:
    """One fit per preprocessing, then ``recipes predict`` of a folder of new images (another size than the
    training images: the resize plays its part) and ``recipes export``."""
    with clean_workdir(f"export_{request.param}") as directory:
        root = digits_folder(directory / "digits", digits=range(4), per_class=10, names=True)
        new = digits_folder(directory / "new", digits=range(4), per_class=2, size=40, seed=1)
        if request.param == "own_preprocessing":
            model = build_tiny_vit(directory / "vit")
            recipe = write_recipe(directory, model, root, image_size=32)
        else:
            build = build_tiny_convnext if request.param == "image_processor" else build_tiny_resnet
            model = build(directory / "pretrained")
            recipe = write_recipe(directory, model, root, image_processor=str(model))
        main(["fit", "-c", str(recipe)])
        main(["predict", "-c", str(recipe), "--ckpt_path", "best", "--data.init_args.predict_path", str(new),
              "--predictions_path", "predictions.csv"])
        with pytest.raises(SystemExit) as done:  # a command of its own, as compare and sweep: exits with its code
            main(["export", "-c", str(recipe), "--ckpt_path", "best", "--export_dir", "exported"])
        assert done.value.code == 0
        with (directory / "predictions.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        return {"directory": directory, "recipe": recipe, "rows": rows, "export": directory / "exported",
                "kind": request.param}


def test_the_export_reloads_in_transformers_with_the_predictions_of_recipes_predict(exported):
    rows, export = exported["rows"], exported["export"]
    assert sorted(p.name for p in export.iterdir()) == ["config.json", "model.safetensors", "preprocessor_config.json"]
    paths = [str(Path(exported["directory"], row["path"])) if not Path(row["path"]).is_absolute() else row["path"]
             for row in rows]
    assert len(paths) == 8 and all(Path(p).is_file() for p in paths)
    out = subprocess.run([sys.executable, "-c", FRESH, str(export), json.dumps(paths)], capture_output=True, text=True,
                         env={**recipes_env(), "HF_HUB_OFFLINE": "1"}, cwd=REPO, timeout=300, check=True)
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    assert fresh["id2label"] == {str(i): name for i, name in enumerate(CLASSES)}
    predicted = torch.tensor([[float(row[f"prob_{name}"]) for name in CLASSES] for row in rows], dtype=torch.float64)
    loaded = torch.tensor(fresh["probs"], dtype=torch.float64)
    print(f"{exported['kind']}: largest difference {float((loaded - predicted).abs().max()):.2e}")
    assert torch.allclose(loaded, predicted, atol=1e-5, rtol=0)
    assert [row["prediction"] for row in rows] == [CLASSES[i] for i in loaded.argmax(dim=1).tolist()]
    expected = "ViTImageProcessor" if exported["kind"] == "own_preprocessing" else "ConvNextImageProcessor"
    assert fresh["processor"].startswith(expected)


def test_bad_exports_are_one_line_each(exported, capsys, monkeypatch):
    if exported["kind"] != "own_preprocessing":
        pytest.skip("the cases need one fit")
    monkeypatch.chdir(exported["directory"])
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
