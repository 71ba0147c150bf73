"""A fine-tune whose data module's ``image_processor`` prepares images otherwise than the pretrained network's own
processor (size, mean, std) says so in one warning line before training; the network's own processor, or one that
prepares images the same way, says nothing."""

from __future__ import annotations

import pytest

from recipes.cli import main
from tests.conftest import CONFIGS
from tests.hf_image_models import build_tiny_resnet, digits_folder, quiet_processor

pytestmark = pytest.mark.usefixtures("one_thread")
SAYS = "prepares images otherwise than the processor of the pretrained network"


@pytest.fixture(scope="module")
def network_and_processors(tmp_path_factory):
    root = tmp_path_factory.mktemp("processors")
    network = build_tiny_resnet(root / "resnet")  # mean and std 0.5, shortest edge 32, crop 0.875
    other = root / "imagenet_normalized"
    quiet_processor("ConvNextImageProcessor", size={"shortest_edge": 32}, crop_pct=0.875,
                    image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]).save_pretrained(other)
    same = root / "same_as_network"
    quiet_processor("ConvNextImageProcessor", size={"shortest_edge": 32}, crop_pct=0.875).save_pretrained(same)
    images = digits_folder(root / "digits", digits=range(3), per_class=8)
    return network, {"other": other, "own": network, "same": same}, images


@pytest.mark.parametrize("processor", ["other", "own", "same"])
def test_a_processor_unlike_the_networks_is_one_warning(processor, network_and_processors, workdir, recwarn):
    network, processors, images = network_and_processors
    main(["fit", "-c", str(CONFIGS / "image_finetune_hf.yaml"),
          f"--model.init_args.model.init_args.name_or_path={network}",
          f"--data.init_args.image_processor={processors[processor]}", f"--data.init_args.root={images}",
          "--data.init_args.num_workers=0", "--data.init_args.batch_size=8", "--data.init_args.batch_augmentation=null",
          "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
          "--mlflow_model=false"])
    # printed as one `recipes: warning:` line; in-process, pytest records it instead
    lines = [str(w.message) for w in recwarn if SAYS in str(w.message)]
    if processor == "other":
        assert len(lines) == 1 and lines[0].startswith("the data's image_processor "), lines
        assert "mean [0.485, 0.456, 0.406] vs [0.5, 0.5, 0.5]" in lines[0], lines[0]
        assert "std [0.229, 0.224, 0.225] vs [0.5, 0.5, 0.5]" in lines[0], lines[0]
        assert "image size" not in lines[0] and f"image_processor: {network}" in lines[0]
    else:
        assert lines == []
