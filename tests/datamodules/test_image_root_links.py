"""An image root reached through a symbolic link (issue 53, section 3): the classes and files are those of the folder
the link resolves to, whichever path names it. ``ln -s <folder> images`` run twice puts a second link inside the
folder (``<folder>/<name> -> <folder>``): a link back to the root is no class of its own (it held every image again,
60 files for 30, and shifted every label after it), and a link inside a class folder never brings another class's
images into it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from PIL import Image

from datamodules import ImageFolderDataModule
from recipes.cli import main
from tests.conftest import runs_of

CLASSES = ["roses", "tulips", "violets"]
PER_CLASS = 3
RECIPE = """\
seed_everything: 0
trainer:
  max_epochs: 1
model:
  class_path: lightning_modules.ClassificationModule
  init_args:
    model:
      class_path: lightning_modules.models.MLP
      init_args:
        hidden_sizes: [8]
data:
  class_path: datamodules.ImageFolderDataModule
  init_args:
    root: {root}
    image_size: 8
    batch_size: 4
    val_fraction: 0.34
"""


def image_folder(folder: Path) -> None:
    """``PER_CLASS`` small PNGs in each class folder, each class its own colour."""
    for label, name in enumerate(CLASSES):
        (folder / name).mkdir(parents=True)
        for i in range(PER_CLASS):
            Image.new("RGB", (8, 8), (80 * label, 20 * i, 0)).save(folder / name / f"{i}.png")


@pytest.fixture
def linked(tmp_path: Path) -> dict[str, Path]:
    """``real/`` (3 classes), ``link -> real``, and the links a second ``ln -s`` and a careless one leave inside:
    ``real/flowers -> real`` (sorted before every class) and ``real/roses/all -> ..`` (the root, from a class)."""
    real = tmp_path / "real"
    image_folder(real)
    (tmp_path / "link").symlink_to(real)
    (real / "flowers").symlink_to(real)  # what `ln -s <real> link` does when link exists already
    (real / "roses" / "all").symlink_to("..")
    return {"real": real, "link": tmp_path / "link"}


def seen(root: Path) -> tuple[list[str], int, list[int]]:
    module = ImageFolderDataModule(root=str(root), image_size=8, batch_size=4)
    paths, labels = module.load()
    return module.class_names, len(paths), torch.bincount(labels).tolist()


def test_a_linked_root_sees_the_classes_and_files_of_the_folder_it_resolves_to(linked):
    expected = (CLASSES, len(CLASSES) * PER_CLASS, [PER_CLASS] * len(CLASSES))
    for root in (linked["link"], linked["real"]):
        with pytest.warns(UserWarning) as caught:
            assert seen(root) == expected, root
        said = [str(w.message) for w in caught if "flowers" in str(w.message)]
        assert len(said) == 1 and "links back to the image root" in said[0] and "\n" not in said[0], said


def test_two_class_folders_of_one_folder_are_refused_in_one_line(tmp_path):
    image_folder(tmp_path / "real")
    (tmp_path / "real" / "roses_too").symlink_to("roses")
    with pytest.raises(ValueError) as err:
        ImageFolderDataModule(root=str(tmp_path / "real"), image_size=8)
    message = str(err.value)
    assert "class folders 'roses' and 'roses_too' are the same folder" in message and "\n" not in message, message


def test_a_recipe_fit_through_the_link_trains_on_the_resolved_classes(linked, workdir):
    (workdir / "images.yaml").write_text(RECIPE.format(root=linked["link"]))
    main(["fit", "-c", "images.yaml"])
    (run,) = runs_of(workdir, "images")  # the experiment is the recipe's name
    rows = {d.dataset.name: json.loads(d.dataset.profile)["num_rows"] for d in run.inputs.dataset_inputs}
    assert sum(rows.values()) == len(CLASSES) * PER_CLASS, rows  # train + val
    (last,) = (workdir / "checkpoints").glob("*/*/last.ckpt")
    ckpt = torch.load(last, weights_only=True, map_location="cpu")
    assert ckpt["ImageFolderDataModule"]["class_names"] == CLASSES
    assert os.path.realpath(linked["link"]) == str(linked["real"].resolve())
