"""``HFImageClassifier`` (issue 33 point 1): a pretrained Hugging Face image classifier with a head for the data's
classes, its sizes and class names linked from ``ImageFolderDataModule`` through a recipe, and the fine-tuning tools
(freeze, unfreeze_at_epoch, layerwise_lr_decay, channels_last) on ViT, ResNet and ConvNeXt. Tiny models built and
saved locally (``tests/hf_image_models.py``): nothing is downloaded."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule
from lightning_modules.fine_tuning.learning_rates import block_stack
from lightning_modules.models import HFImageClassifier
from recipes.cli import main
from tests.hf_image_models import PRETRAINING_CLASSES, build_tiny_vit, digits_folder, local_hf_image_models

pytestmark = pytest.mark.usefixtures("one_thread")
FAMILIES = ("vit", "resnet", "convnext")
BACKBONES = {"vit": "vit", "resnet": "resnet", "convnext": "convnext"}
STACKS = {"vit": "model.vit.layers",  # transformers 5: no ViT encoder module
          "resnet": "model.resnet.encoder.stages",
          "convnext": "model.convnext.encoder.stages"}


@pytest.fixture(scope="module")
def dirs() -> dict[str, Path]:
    return local_hf_image_models()


def saved_head(directory: Path) -> dict[str, torch.Tensor]:
    """The head weights as saved in the directory (read with transformers itself)."""
    from transformers import AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(directory, local_files_only=True)
    return {k: v.clone() for k, v in model.state_dict().items() if not k.startswith(model.base_model_prefix)}


def head_of(network: HFImageClassifier) -> dict[str, torch.Tensor]:
    prefix = network.model.base_model_prefix
    return {k: v for k, v in network.model.state_dict().items() if not k.startswith(prefix)}


def head_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("HFImageClassifier:")]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_head_is_kept_replaced_or_reinitialized_in_one_line(family, dirs, caplog, capfd):
    caplog.set_level(logging.INFO)
    directory = dirs[family]
    pretrained = saved_head(directory)
    capfd.readouterr()

    # the data's classes are the pretraining labels, in order: the pretrained head is kept as it is
    kept = HFImageClassifier(str(directory), 5, class_names=list(PRETRAINING_CLASSES), in_channels=3, image_size=32)
    assert head_lines(caplog) == [
        f"HFImageClassifier: the pretrained head of 5 classes is kept: its labels are the data's class names ({directory})"
    ]
    assert all(torch.equal(head_of(kept)[k], v) for k, v in pretrained.items())
    assert kept.model.config.id2label == dict(enumerate(PRETRAINING_CLASSES))

    # another number of classes: a new head of that size
    caplog.clear()
    names = ["zero", "one", "two"]
    replaced = HFImageClassifier(str(directory), 3, class_names=names)
    assert head_lines(caplog) == [
        f"HFImageClassifier: a new head of 3 classes replaces the pretrained head of 5 ({directory})"
    ]
    assert replaced(torch.randn(2, 3, 32, 32)).shape == (2, 3)
    assert replaced.model.config.id2label == {0: "zero", 1: "one", 2: "two"}
    assert replaced.model.config.label2id == {"zero": 0, "one": 1, "two": 2}

    # as many classes but other labels (or the same labels in another order): the head is re-initialized, never kept
    for other in (["a", "b", "c", "d", "e"], list(reversed(PRETRAINING_CLASSES))):
        caplog.clear()
        torch.manual_seed(0)
        reset = HFImageClassifier(str(directory), 5, class_names=other)
        assert head_lines(caplog) == [
            f"HFImageClassifier: the pretrained head of 5 classes is re-initialized: its labels are not the data's "
            f"class names ({directory})"
        ]
        assert all(not torch.equal(head_of(reset)[k], v) for k, v in pretrained.items() if v.numel() > 1)
        assert reset.model.config.id2label == dict(enumerate(other))
    # the backbone is the pretrained one in every case
    prefix = kept.model.base_model_prefix
    backbone = {k: v for k, v in kept.model.state_dict().items() if k.startswith(prefix)}
    assert all(torch.equal(reset.model.state_dict()[k], v) for k, v in backbone.items())
    # transformers' own multi-line load report is left out; its other output (the progress bar) is its own
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "MISMATCH" not in out + err
    assert kept.training and replaced.training and all(m.training for m in reset.modules())  # built in train mode
    assert kept.part_names == {"backbone": f"model.{BACKBONES[family]}", "head": "model.classifier"}


def test_sizes_are_checked_against_the_model_in_one_line(dirs):
    vit, resnet = str(dirs["vit"]), str(dirs["resnet"])
    cases = [
        (dict(name_or_path=vit, num_classes=3, in_channels=1),
         f"HFImageClassifier: the images have 1 channel(s) but '{vit}' takes 3: set the data's channels to 3 (RGB)"),
        (dict(name_or_path=vit, num_classes=3, image_size=(32, 48)),
         f"HFImageClassifier: the images are 32x48 but '{vit}' takes 32x32 (its position embeddings fix the size): "
         "set the data's image_size to [32, 32]"),
        (dict(name_or_path=resnet, num_classes=3, class_names=["a", "b"]),
         "HFImageClassifier: 2 class_names for num_classes=3: give one name per class"),
        (dict(name_or_path=resnet, num_classes=0), "HFImageClassifier: num_classes must be >= 1, got 0"),
        (dict(name_or_path="nobody/no-such-model", num_classes=3),  # offline in the tests: not in the cache
         "HFImageClassifier: cannot load 'nobody/no-such-model': it is neither a local directory saved with "
         "save_pretrained nor a Hugging Face hub model that can be loaded (We couldn't connect to "
         "'https://huggingface.co' to load the files, and couldn't find them in the cached files.)"),
        (dict(name_or_path=str(vit) + "-missing", num_classes=3),
         f"HFImageClassifier: model directory '{vit}-missing' does not exist (or is not a directory)"),
    ]
    for kwargs, expected in cases:
        with pytest.raises(ValueError) as err:
            HFImageClassifier(**kwargs)
        assert str(err.value) == expected
    # ViT: the size its position embeddings fix, also when none is given; convolutional networks take any size
    assert HFImageClassifier(vit, 3).image_size == (32, 32)
    for family in ("resnet", "convnext"):
        network = HFImageClassifier(str(dirs[family]), 3, image_size=(40, 56))
        assert network.image_size == (40, 56) and network(torch.randn(2, 3, 40, 56)).shape == (2, 3)
        assert HFImageClassifier(str(dirs[family]), 3).image_size is None
    with pytest.raises(ValueError, match=r"expects images of shape \(batch, channels, height, width\)"):
        HFImageClassifier(resnet, 3)(torch.randn(3, 32, 32))


def test_a_grayscale_model_takes_one_channel(tmp_path):
    gray = build_tiny_vit(tmp_path / "gray", num_channels=1)
    network = HFImageClassifier(str(gray), 2, in_channels=1)
    assert network.in_channels == 1 and network(torch.randn(2, 1, 32, 32)).shape == (2, 2)
    with pytest.raises(ValueError, match="set the data's channels to 1 \\(grayscale\\)"):
        HFImageClassifier(str(gray), 2, in_channels=3)


# --- the fine-tuning tools ----------------------------------------------------------------------------------------
class Watch(L.Callback):
    """The first embedding weight and the head weight at the start of every training batch."""

    def __init__(self, embedding: str) -> None:
        self.embedding, self.embeddings, self.heads, self.formats = embedding, [], [], []

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        params = dict(module.model.named_parameters())
        self.embeddings.append(params[self.embedding].detach().clone())
        self.heads.append(params["model.classifier.weight" if "model.classifier.weight" in params
                                 else "model.classifier.1.weight"].detach().clone())
        conv = next(p for p in module.model.parameters() if p.ndim == 4)
        self.formats.append(conv.is_contiguous(memory_format=torch.channels_last))


EMBEDDINGS = {"vit": "model.vit.embeddings.patch_embeddings.projection.weight",
              "resnet": "model.resnet.embedder.embedder.convolution.weight",
              "convnext": "model.convnext.embeddings.patch_embeddings.weight"}


@pytest.mark.parametrize("family", FAMILIES)
def test_freeze_unfreeze_layerwise_decay_and_channels_last(family, dirs, tmp_path):
    torch.manual_seed(0)
    network = HFImageClassifier(str(dirs[family]), 3, class_names=["a", "b", "c"])
    assert block_stack(network)[0] == STACKS[family]  # the stack of blocks layerwise_lr_decay decays over
    embeddings = f"model.{BACKBONES[family]}.embeddings" if family != "resnet" else "model.resnet.embedder"
    task = ClassificationModule(
        network, num_classes=3, freeze=[embeddings, STACKS[family]], unfreeze_at_epoch=1,
        layerwise_lr_decay=0.5, channels_last=family != "vit",
        optimizer=lambda params: torch.optim.AdamW(params, lr=0.01),
    )
    lrs = {g["name"]: g["lr"] for g in task.configure_optimizers().param_groups}
    # two blocks: the top one at 0.5, the lower at 0.25, what lies below the stack (embeddings) at 0.125
    assert lrs["layer2/decay"] == pytest.approx(0.005) and lrs["layer1/decay"] == pytest.approx(0.0025)
    assert lrs["layer0/decay"] == pytest.approx(0.00125)
    assert lrs["decay"] == 0.01  # the head: above the stack, the base rate

    data = TensorDataset(torch.randn(16, 3, 32, 32), torch.randint(0, 3, (16,)))
    watch = Watch(EMBEDDINGS[family])
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[watch])
    trainer.fit(task, DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
    # epoch 0 (batches 0-1): the backbone frozen, the head learns; epoch 1 (batches 2-3): all of it learns
    assert torch.equal(watch.embeddings[0], watch.embeddings[2])
    assert not torch.equal(watch.heads[0], watch.heads[1])
    assert not torch.equal(watch.embeddings[2], watch.embeddings[3])
    assert all(watch.formats) == (family != "vit")


# --- through a recipe: sizes and class names linked from the data -------------------------------------------------
def recipe(directory: Path, root: Path, **network) -> Path:
    config = {
        "seed_everything": 0,
        "trainer": {"max_epochs": 1, "limit_train_batches": 2, "limit_val_batches": 1, "log_every_n_steps": 1},
        "model": {"class_path": "lightning_modules.ClassificationModule", "init_args": {
            "model": {"class_path": "lightning_modules.models.HFImageClassifier",
                      "init_args": {"name_or_path": str(directory), **network}}}},
        "data": {"class_path": "datamodules.ImageFolderDataModule", "init_args": {
            "root": str(root), "image_size": 32, "batch_size": 8, "val_fraction": 0.25, "seed": 0}},
    }
    path = root.parent / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    return digits_folder(tmp_path_factory.mktemp("digits") / "images", digits=range(5), per_class=8, names=True)


def one_error_line(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("recipes: error: ") and "Traceback" not in "\n".join(lines)
    return lines[-1]


def test_a_recipe_links_class_names_and_image_size_from_the_data(dirs, digits, workdir, caplog, capsys):
    caplog.set_level(logging.INFO)
    path = recipe(dirs["resnet"], digits)
    main(["fit", "-c", str(path), "--model.init_args.model.init_args.image_size", "32"])  # written, as the data's
    assert head_lines(caplog) == [
        "HFImageClassifier: the pretrained head of 5 classes is re-initialized: its labels are not the data's class "
        f"names ({dirs['resnet']})"
    ]
    (checkpoint,) = Path("checkpoints").rglob("best.ckpt")
    network = torch.load(checkpoint, weights_only=False)["hyper_parameters"]["model"]["init_args"]
    assert network["class_names"] == ["four", "one", "three", "two", "zero"]
    assert tuple(network["image_size"]) == (32, 32) and network["in_channels"] == 3 and network["num_classes"] == 5
    # a written image_size the data does not agree with is one line
    line = one_error_line(capsys, "fit", "-c", str(path), "--model.init_args.model.init_args.image_size", "[24, 24]")
    assert line == ("recipes: error: model.init_args.model.init_args.image_size is (24, 24) in the config, but "
                    "ImageFolderDataModule has image_size (32, 32): leave image_size out of the recipe (the data sets "
                    "it) or make it (32, 32)")
    # the ViT's fixed size against the data's
    line = one_error_line(capsys, "fit", "-c", str(recipe(dirs["vit"], digits)), "--data.init_args.image_size", "16")
    assert line == (f"recipes: error: HFImageClassifier: the images are 16x16 but '{dirs['vit']}' takes 32x32 (its "
                    "position embeddings fix the size): set the data's image_size to [32, 32]")
    line = one_error_line(capsys, "fit", "-c", str(path), "--data.init_args.channels", "1")
    assert line.endswith("set the data's channels to 3 (RGB)")
