"""A model fitted with ``ImageFolderDataModule(image_processor=...)`` predicts without the processor's directory (the
checkpoint holds its preprocessing), through ``recipes predict`` and the run's MLflow model, whose input is a ``path``
column of image files or an ``image`` column of base64-encoded image bytes (what ``mlflow models serve`` clients
send in JSON), with the same table either way."""

from __future__ import annotations

import base64
import csv
import shutil
import warnings
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.exceptions import MlflowException
from PIL import Image

from lightning_modules import ClassificationModule
from recipes.cli import main
from recipes.predict.model_logging import MODEL_TAG
from tests.conftest import runs_of, working_directory
from tests.hf_image_models import digits_folder, quiet_processor

RECIPE = """\
seed_everything: 0
trainer:
  max_epochs: 1
  deterministic: true
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    model:
      class_path: lightning_modules.models.MLP
      init_args:
        hidden_sizes: [16]
data:
  class_path: datamodules.ImageFolderDataModule
  init_args:
    root: digits
    image_processor: ./processor
    batch_size: 8
    val_fraction: 0.25
"""
CLASSES = ["0", "1", "2"]

pytestmark = pytest.mark.usefixtures("one_thread")


def pixel_values(processor_dir: Path, paths: list[Path]) -> torch.Tensor:
    """What the Hugging Face processor itself makes of the files."""
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = transformers.AutoImageProcessor.from_pretrained(processor_dir, local_files_only=True)
    images = []
    for path in paths:
        with Image.open(path) as image:
            images.append(processor(images=image, return_tensors="pt", do_convert_rgb=True)["pixel_values"][0])
    return torch.stack(images)


@pytest.fixture(scope="module")
def fitted(clean_workdir):
    """A 1-epoch MLP fit on 3 digit classes with a ConvNeXt-style processor (shorter side 16 / 0.875, center crop
    16), new images (digits and a non-square photo-like RGB image), the model's probabilities on the processor's
    own pixel values for them, and then the processor's directory deleted."""
    with clean_workdir("image_model_input") as directory:
        digits_folder(directory / "digits", digits=range(3), per_class=8)
        quiet_processor("ConvNextImageProcessor", size={"shortest_edge": 16}, crop_pct=0.875).save_pretrained(
            directory / "processor"
        )
        (directory / "images.yaml").write_text(RECIPE)
        main(["fit", "-c", "images.yaml", "--trainer.limit_train_batches", "2"])
        new = directory / "new"
        digits_folder(directory / "more", digits=range(3), per_class=2, seed=1)
        paths = sorted((directory / "more").rglob("*.png"))
        new.mkdir()
        for i, path in enumerate(paths):
            shutil.copy(path, new / f"{i}.png")
        rng = np.random.default_rng(0)
        Image.fromarray(rng.integers(0, 256, (23, 41, 3), dtype=np.uint8)).save(new / "wide.png")
        files = sorted(new.glob("*.png"))
        pixels = pixel_values(directory / "processor", files)
        shutil.rmtree(directory / "processor")
    return directory, files, pixels


def probabilities_of(checkpoint: Path, pixels: torch.Tensor) -> torch.Tensor:
    module = ClassificationModule.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    with torch.no_grad():
        return module.probabilities(module.logits(pixels)).double()


def table_probabilities(frame: pd.DataFrame) -> torch.Tensor:
    return torch.tensor(frame[[f"prob_{c}" for c in CLASSES]].astype(float).to_numpy(), dtype=torch.float64)


def test_recipes_predict_needs_no_processor_directory(fitted):
    directory, files, pixels = fitted
    assert not (directory / "processor").exists()
    out = directory / "predictions.csv"

    with working_directory(directory):
        main(["predict", "-c", "images.yaml", "--ckpt_path", "last", "--data.init_args.predict_path", "new",
              "--predictions_path", str(out)])
    with out.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["path"] for row in rows] == [str(Path("new") / f.name) for f in files]
    probs = table_probabilities(pd.DataFrame(rows))
    (last,) = (directory / "checkpoints").glob("*/*/last.ckpt")
    # the processor's own pixel values through the model: the training preprocessing came from the checkpoint
    assert torch.allclose(probs, probabilities_of(last, pixels), atol=1e-5)


def test_the_mlflow_model_takes_paths_or_base64_images_with_the_same_table(fitted):
    directory, files, pixels = fitted
    (run,) = [r for r in runs_of(directory, "images") if MODEL_TAG in r.data.tags]  # the fit (not the predict)

    encoded = [base64.b64encode(f.read_bytes()).decode("ascii") for f in files]
    with working_directory(directory):
        mlflow.set_tracking_uri(f"sqlite:///{directory / 'mlflow.db'}")
        try:
            model = mlflow.pyfunc.load_model(run.data.tags[MODEL_TAG])
            # the signature: either column may be left out (a row gives a path or an image)
            assert {c.name: c.required for c in model.metadata.get_input_schema().inputs} == {
                "path": False, "image": False}  # fmt: skip
            by_path = model.predict(pd.DataFrame({"path": [str(f) for f in files]}))
            by_image = model.predict(pd.DataFrame({"image": encoded}))
            both = model.predict(pd.DataFrame({"path": [str(f) for f in files], "image": encoded}))
            mixed = model.predict(pd.DataFrame({"path": [str(files[0]), None], "image": [None, encoded[1]]}))
            with pytest.raises(MlflowException) as refused:
                model.predict(pd.DataFrame({"image": [encoded[0], "not base64!"]}))
            with pytest.raises(MlflowException) as not_an_image:
                model.predict(pd.DataFrame({"image": [base64.b64encode(b"plain text").decode()]}))
        finally:
            mlflow.set_tracking_uri(None)
    assert list(by_path.columns) == ["path", "prediction", *[f"prob_{c}" for c in CLASSES]]
    # the same images by path and by their bytes: identical probabilities and predictions
    outputs = [c for c in by_path.columns if c != "path"]
    assert by_path[outputs].equals(by_image[outputs])
    assert by_path.equals(both)
    assert by_image["path"].isna().all()
    assert mixed["path"].tolist()[0] == str(files[0]) and mixed["path"].isna().tolist() == [False, True]
    # (another batch size: equal up to float rounding)
    assert torch.allclose(table_probabilities(mixed), table_probabilities(by_path)[:2], atol=1e-6)
    (best,) = (directory / "checkpoints").glob("*/*/best.ckpt")
    assert torch.allclose(table_probabilities(by_path), probabilities_of(best, pixels), atol=1e-5)
    message = str(refused.value)
    assert message.startswith("loopwise model: bad input: ImageFolderDataModule: row 1 of the 'image' column is not "
                              "base64") and "\n" not in message
    assert "row 0 of the 'image' column is not an image file" in str(not_an_image.value)


def test_the_data_guard_compares_the_processor_and_the_checkpoint_its_preprocessing(fitted, capsys):
    """The guard compares ``image_processor`` as text, as the text modules' ``tokenizer`` (fix: the trained path, which
    works although deleted); with ``--allow_data_change`` the same processor in another directory evaluates, and a
    processor that prepares images otherwise is refused by the data module (the model would see other inputs)."""
    directory, _, _ = fitted
    (last,) = (directory / "checkpoints").glob("*/*/last.ckpt")
    with working_directory(directory):
        quiet_processor("ConvNextImageProcessor", size={"shortest_edge": 16}, crop_pct=0.875).save_pretrained("copy")
        quiet_processor("ConvNextImageProcessor", size={"shortest_edge": 16}, crop_pct=0.5).save_pretrained("other")
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(["validate", "-c", "images.yaml", "--ckpt_path", str(last),
                  "--data.init_args.image_processor", "./copy"])
        err = capsys.readouterr().err.strip()
        assert stop.value.code == 2 and len(err.splitlines()) == 1, err
        assert "image_processor './processor' in the checkpoint, './copy' now" in err
        assert "--data.init_args.image_processor ./processor" in err
        main(["validate", "-c", "images.yaml", "--ckpt_path", str(last), "--data.init_args.image_processor", "./copy",
              "--allow_data_change", "true"])
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(["validate", "-c", "images.yaml", "--ckpt_path", str(last), "--data.init_args.image_processor",
                  "./other", "--allow_data_change", "true"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert lines[0] == ("recipes: validate on other data settings than the checkpoint's, as allowed: "
                            "image_processor: './processor' -> './other'")
        err = lines[1]
        assert stop.value.code == 2 and len(lines) == 2 and err.startswith("recipes: error: "), lines
        assert "image_processor './other' prepares images with resize shortest_edge shorter side 32" in err
        assert "but the checkpoint was trained with resize shortest_edge shorter side 18, center crop 16x16" in err
        main(["validate", "-c", "images.yaml", "--ckpt_path", str(last)])  # the trained path, deleted: fine
