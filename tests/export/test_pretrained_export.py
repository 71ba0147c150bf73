"""``recipes.export.pretrained_export``: what is written for each network and preprocessing, and what is refused in
one line (another network, grayscale images, a binary head, an image processor class that is not transformers')."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lightning_modules.models import MLP, HFImageClassifier
from recipes.export.pretrained_export import ExportError, check_export_dir, export_pretrained, image_processor_of
from tests.conftest import REPO
from tests.hf_image_models import local_hf_image_models

pytestmark = pytest.mark.usefixtures("one_thread")
REVIEWS = REPO / "data" / "reviews.csv"


class Images(SimpleNamespace):
    """A data module's side of the export: its class names, channels, image size and checkpoint state."""

    def state_dict(self) -> dict:
        return self.state


def images(channels=3, state=None) -> Images:
    state = {"class_names": ["a", "b", "c"], "mean": [0.5] * channels, "std": [0.25] * channels} if state is None else state
    return Images(class_names=["a", "b", "c"], channels=channels, image_size=(32, 40), state=state)


def test_the_own_preprocessing_becomes_a_vit_processor_and_id2label_the_class_names(tmp_path):
    network = HFImageClassifier(str(local_hf_image_models()["resnet"]), 3)
    written = export_pretrained(network, images(), tmp_path / "out")
    assert written == ["config.json", "model.safetensors", "preprocessor_config.json"]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["id2label"] == {"0": "a", "1": "b", "2": "c"} and config["label2id"] == {"a": 0, "b": 1, "c": 2}
    processor = json.loads((tmp_path / "out" / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 32, "width": 40} and processor["resample"] == 2  # PIL bilinear
    assert processor["image_mean"] == [0.5] * 3 and processor["image_std"] == [0.25] * 3
    assert processor["rescale_factor"] == pytest.approx(1 / 255) and processor["do_normalize"]


def test_what_cannot_be_exported_is_one_line(tmp_path):
    resnet = HFImageClassifier(str(local_hf_image_models()["resnet"]), 3)
    cases = [
        (MLP(4, 3, [8]), images(), "export writes Hugging Face networks (HFImageClassifier, HFSequenceClassifier); "
         "this recipe's network is MLP: use its checkpoint, or its MLflow model (recipes fit logs one)"),
        (resnet, images(channels=1), "the images are grayscale (channels 1): export writes an RGB image processor; "
         "fine-tune with channels: 3 to export"),
        (HFImageClassifier(str(local_hf_image_models()["resnet"]), 1), images(),
         "the network has 1 output(s) for 3 classes (a binary task's single logit): export needs one output per class "
         "(task: multiclass)"),
    ]
    for network, data, line in cases:
        with pytest.raises(ExportError) as err:
            export_pretrained(network, data, tmp_path / "out")
        assert str(err.value) == line
        assert not (tmp_path / "out").exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    with pytest.raises(ExportError, match="already exists and is not an empty directory"):
        check_export_dir(tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"
    assert check_export_dir(tmp_path / "new") == tmp_path / "new"


def test_a_recorded_processor_is_rebuilt_only_as_a_transformers_image_processor(tmp_path):
    from transformers import ConvNextImageProcessor

    config = ConvNextImageProcessor(size={"shortest_edge": 48}, crop_pct=0.875).to_dict()
    rebuilt = image_processor_of(images(state={"image_processor": {"class": "ConvNextImageProcessor", "config": config}}))
    assert type(rebuilt).__name__.startswith("ConvNextImageProcessor") and rebuilt.size == {"shortest_edge": 48}
    assert rebuilt.crop_pct == 0.875
    for name in ("AutoModel", "PreTrainedTokenizerFast", "os.system", "nothing"):
        with pytest.raises(ExportError) as err:
            image_processor_of(images(state={"image_processor": {"class": name, "config": {}}}))
        assert str(err.value) == (
            f"the checkpoint's image processor class {name!r} is not a transformers image processor: refusing to build "
            "it; fine-tune with a Hugging Face image processor"
        )


def test_a_text_classifier_is_written_with_its_tokenizer_and_reloads_with_the_same_logits(tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from datamodules import TextClassificationDataModule
    from lightning_modules.models import HFSequenceClassifier
    from tests.hf_models import local_hf_models

    bert = str(local_hf_models()["bert"])
    data = TextClassificationDataModule(str(REVIEWS), tokenizer=bert)
    network = HFSequenceClassifier(bert, num_classes=data.num_classes).eval()
    written = export_pretrained(network, data, tmp_path / "out")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(written)
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "out")
    assert model.config.id2label == dict(enumerate(data.class_names))
    texts = ["A wonderful film, I loved it.", "Boring and far too long."]
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, network(**inputs))
    # loopwise's own word tokenizer is not a transformers tokenizer
    with pytest.raises(ExportError, match="encoded with loopwise's own tokenizer"):
        export_pretrained(network, TextClassificationDataModule(str(REVIEWS)), tmp_path / "word")
