"""``ImageFolderDataModule(image_processor=...)``: the data module prepares every image exactly as the Hugging Face
image processor does (its PIL implementation), stores that preprocessing in its checkpoint state, and refuses what it
cannot follow in one line."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from datamodules.image_folder import ImageFolderDataModule
from tests.hf_image_models import digits_folder, quiet_processor

PROCESSORS = {
    # ViT: warp to (height, width), bilinear
    "vit": ("ViTImageProcessor", {"size": {"height": 24, "width": 20}}),
    # ConvNeXt (and ResNet) below 384: shorter side to 24 / 0.875 = 27, center crop 24, bicubic
    "convnext": ("ConvNextImageProcessor", {"size": {"shortest_edge": 24}, "crop_pct": 0.875}),
    # ConvNeXt from 384 on: warp to a square
    "convnext-384": ("ConvNextImageProcessor", {"size": {"shortest_edge": 384}}),
    # DeiT: warp to 30x30, center crop 24x24, bicubic
    "deit": ("DeiTImageProcessor", {"size": {"height": 30, "width": 30}, "crop_size": {"height": 24, "width": 24}}),
    # CLIP: shorter side to 20, center crop 24x22 (zero padding where the image is smaller), RGB conversion
    "clip": ("CLIPImageProcessor", {"size": {"shortest_edge": 20}, "crop_size": {"height": 24, "width": 22}}),
    # BEiT with its center crop on
    "beit": (
        "BeitImageProcessor",
        {"size": {"height": 28, "width": 28}, "do_center_crop": True, "crop_size": {"height": 24, "width": 24}},
    ),
}


def save_processor(directory: Path, kind: str, **overrides) -> Path:
    name, kwargs = PROCESSORS[kind]
    processor = quiet_processor(name, **{**kwargs, **overrides})
    processor.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    """Digits PNGs (32x32 RGB) of 3 classes, plus a non-square RGB, a tall RGBA and a grey image."""
    root = digits_folder(tmp_path_factory.mktemp("images") / "digits", digits=range(3), per_class=3)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)).save(root / "0" / "wide.png")
    Image.fromarray(rng.integers(0, 256, (61, 29, 4), dtype=np.uint8), "RGBA").save(root / "1" / "tall.png")
    Image.fromarray(rng.integers(0, 256, (40, 45), dtype=np.uint8), "L").save(root / "2" / "grey.png")
    return root


def module(root: Path, processor: Path | None, **kwargs) -> ImageFolderDataModule:
    settings = dict(val_fraction=0.0, test_fraction=0.0, batch_size=4, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ImageFolderDataModule(str(root), image_processor=None if processor is None else str(processor),
                                     **{**settings, **kwargs})


def reference(processor_dir: Path, path: str) -> torch.Tensor:
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = transformers.AutoImageProcessor.from_pretrained(processor_dir, local_files_only=True)
    with Image.open(path) as image:  # RGB conversion on, as the data module always converts (CLIP's default)
        return processor(images=image, return_tensors="pt", do_convert_rgb=True)["pixel_values"][0]


@pytest.mark.parametrize("cache", [False, True], ids=["read", "cache"])
@pytest.mark.parametrize("kind", list(PROCESSORS))
def test_images_equal_the_processors_pixel_values(kind, cache, image_root, tmp_path):
    processor_dir = save_processor(tmp_path / kind, kind)
    dm = module(image_root, processor_dir, cache=cache)
    dm.setup()
    dataset = dm.datasets["train"]
    assert len(dataset) == 12
    for index, path in enumerate(dataset.paths):
        expected = reference(processor_dir, path)
        image = dataset[index][0]
        assert image.shape == expected.shape == (3, *dm.image_size), path
        assert torch.allclose(image, expected, atol=1e-5, rtol=0), (path, (image - expected).abs().max().item())
    assert dm.in_channels == 3 and dm.in_features == 3 * dm.image_size[0] * dm.image_size[1]


def test_sizes_and_normalization_come_from_the_processor(image_root, tmp_path):
    imagenet = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}
    dm = module(image_root, save_processor(tmp_path / "p", "deit", **imagenet))
    assert dm.image_size == (24, 24)  # the crop
    dm.setup()
    # the processor's mean/std, with no statistics pass over the train images
    assert dm.mean.tolist() == pytest.approx(imagenet["image_mean"])
    assert dm.std.tolist() == pytest.approx(imagenet["image_std"])
    # without normalization and rescale: raw 0..255 values
    raw = module(image_root, save_processor(tmp_path / "raw", "deit", do_normalize=False, do_rescale=False))
    raw.setup()
    image = raw.datasets["train"][0][0]
    assert image.max() > 1 and torch.allclose(image, image.round(), atol=1e-4, rtol=0) and image.max() <= 255


def test_without_processor_the_behaviour_is_unchanged(image_root):
    dm = module(image_root, None, image_size=8)
    dm.setup()
    assert dm.image_size == (8, 8) and dm.prepare is None and "preprocessing" not in dm.state_dict()
    assert dm.datasets["train"][0][0].shape == (3, 8, 8)


@pytest.mark.parametrize(
    ("kind", "overrides", "message"),
    [
        ("vit", {"do_pad": True}, "do_pad"),
        ("clip", {"do_center_crop": False}, "without do_center_crop"),
        ("vit", {"size": {"longest_edge": 30}}, "size {'longest_edge': 30} is not supported"),
        ("vit", {"do_resize": False}, "do_resize false"),
    ],
)
def test_options_it_cannot_follow_are_one_line(kind, overrides, message, image_root, tmp_path):
    processor_dir = save_processor(tmp_path / "p", kind, **overrides)
    dm = module(image_root, processor_dir)
    with pytest.raises(ValueError) as error:
        dm.in_channels  # read by the recipe's size links, before any run
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith(f"ImageFolderDataModule: image_processor {str(processor_dir)!r}")


def test_written_size_or_grey_channels_disagreeing_with_the_processor_are_errors(image_root, tmp_path):
    processor_dir = save_processor(tmp_path / "p", "vit")
    with pytest.raises(ValueError, match=r"image_size \[16, 16\] differs from the \[24, 20\] of image_processor"):
        module(image_root, processor_dir, image_size=16)
    with pytest.raises(ValueError, match="channels 1 with image_processor"):
        module(image_root, processor_dir, channels=1)
    assert module(image_root, processor_dir, image_size=[24, 20]).image_size == (24, 20)  # agreeing: fine


def test_a_missing_processor_is_one_line_when_its_preprocessing_is_needed(image_root, tmp_path):
    dm = module(image_root, tmp_path / "gone")
    with pytest.raises(ValueError, match=r"image_processor directory '.*gone' does not exist") as error:
        dm.setup()
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="does not exist"):
        dm.image_size


def test_the_checkpoint_state_holds_the_preprocessing_and_the_processor(image_root, tmp_path):
    processor_dir = save_processor(tmp_path / "p", "convnext")
    dm = module(image_root, processor_dir)
    dm.setup()
    state = dm.state_dict()
    torch.save(state, tmp_path / "state.pt")
    loaded = torch.load(tmp_path / "state.pt", weights_only=True)
    assert loaded == state
    record = loaded["image_processor"]
    assert record["class"] == "ConvNextImageProcessorPil"
    assert json.loads(json.dumps(record["config"])) == record["config"]
    assert record["config"]["crop_pct"] == 0.875 and record["config"]["size"] == {"shortest_edge": 24}
    assert loaded["preprocessing"]["crop"] == [24, 24] and loaded["preprocessing"]["resize_size"] == [27, 27]
    expected = torch.stack([dm.datasets["train"][i][0] for i in range(len(dm.datasets["train"]))])

    # the processor's directory deleted: the checkpoint's state is enough
    shutil.rmtree(processor_dir)
    restored = module(image_root, processor_dir)
    restored.load_state_dict(loaded)
    assert restored.image_size == (24, 24) and restored.in_channels == 3
    restored.setup()
    again = torch.stack([restored.datasets["train"][i][0] for i in range(len(restored.datasets["train"]))])
    assert torch.equal(again, expected)
    assert restored.state_dict()["image_processor"] == record

    # the same processor in another directory: accepted; one that prepares images otherwise: one line
    same = module(image_root, save_processor(tmp_path / "copy", "convnext"))
    same.load_state_dict(loaded)
    other = module(image_root, save_processor(tmp_path / "other", "convnext", crop_pct=0.5))
    with pytest.raises(ValueError, match="prepares images with .* but the checkpoint was trained with"):
        other.load_state_dict(loaded)
    with pytest.raises(ValueError, match="checkpoint was trained with image_processor"):
        module(image_root, None).load_state_dict(loaded)


def test_a_hub_processor_is_not_fetched_when_the_checkpoint_brings_its_preprocessing(image_root, tmp_path):
    """(The tests run with HF_HUB_OFFLINE=1: a hub name cannot load here, as on a machine without network.)"""
    trained = module(image_root, save_processor(tmp_path / "p", "vit"))
    trained.setup()
    state = trained.state_dict()
    hub = module(image_root, "someone/tiny-vit-processor")  # type: ignore[arg-type]
    assert hub.processor.tried is False  # nothing fetched when the module is built
    hub.load_state_dict(state)
    assert hub.image_size == (24, 20)
    hub.setup()
    assert hub.processor.tried is False  # nor when a checkpoint's preprocessing is used
    assert torch.equal(hub.datasets["train"][0][0], trained.datasets["train"][0][0])
    unreachable = module(image_root, "someone/tiny-vit-processor")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'someone/tiny-vit-processor' is neither a local directory with a Hugging "
                                         "Face image processor nor a hub image processor that can be loaded"):
        unreachable.in_channels


def test_the_input_example_shows_a_path_and_a_small_base64_image(image_root, tmp_path):
    import base64
    import io

    big = tmp_path / "big"
    for name in ("a", "b"):
        (big / name).mkdir(parents=True)
        Image.fromarray(np.full((300, 500, 3), 90 if name == "a" else 160, dtype=np.uint8)).save(big / name / "x.png")
    for root, count in ((image_root, 5), (big, 2)):
        frame = module(root, None).raw_examples()
        assert list(frame.columns) == ["path", "image"] and len(frame) == count
        assert frame["path"].isna().tolist() == [False] * (count - 1) + [True]
        assert frame["image"].isna().tolist() == [True] * (count - 1) + [False]
        with Image.open(io.BytesIO(base64.b64decode(frame["image"].iloc[-1]))) as image:
            assert max(image.size) <= 64
    assert image.size == (64, 38)  # 500x300 shrunk, aspect ratio kept


@pytest.mark.parametrize("kind", list(PROCESSORS))
def test_shards_from_recipes_pack_give_the_processors_pixels_as_the_folder_does(kind, image_root, tmp_path):
    """The pretrained image recipe's preprocessing (a Hugging Face image processor) on `recipes pack` shards of the
    folder: the same pixels, sample by sample."""
    from recipes.cli import main

    with pytest.raises(SystemExit) as end:
        main(["pack", str(image_root), str(tmp_path / "shards")])
    assert end.value.code == 0
    processor_dir = save_processor(tmp_path / kind, kind)
    from_folder, from_shards = module(image_root, processor_dir), module(tmp_path / "shards", processor_dir)
    from_folder.setup()
    from_shards.setup()
    assert from_shards.image_size == from_folder.image_size and from_shards.state_dict() == from_folder.state_dict()
    folder_set, shard_set = from_folder.datasets["train"], from_shards.datasets["train"]
    assert len(folder_set) == len(shard_set) == 12
    for index in range(len(folder_set)):
        assert torch.equal(folder_set[index][0], shard_set[index][0]) and folder_set[index][1] == shard_set[index][1]
