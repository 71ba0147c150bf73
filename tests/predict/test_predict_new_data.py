"""``recipes predict`` on new data: a text file without labels, a folder of images, a prompt file for a character LM.

Each test fits a tiny model on tiny generated data (one short epoch), predicts new inputs through the command line
and checks the CSV: one row per input in input order, the ids, class names, probabilities that equal the model's
own outputs on the same inputs prepared by the training pipeline (the checkpoint's vocabulary or normalization).
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from datamodules import CharLMDataModule, ImageFolderDataModule, TextClassificationDataModule
from datamodules.collate import pad_collate
from datamodules.image_folder import ImageFolderDataset
from lightning_modules import ClassificationModule, LanguageModelModule
from recipes.cli import main
from tests.conftest import CONFIGS
from tests.data_files import keyword_rows, save, write_csv, write_jsonl

TEXT = CONFIGS / "text_transformer.yaml"
CHARLM = CONFIGS / "charlm_gpt.yaml"
SHORT_FIT = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one torch thread


def read_predictions(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def best_checkpoint(directory: Path, experiment: str) -> Path:
    (path,) = (directory / "checkpoints" / experiment).glob("*/best.ckpt")
    return path


def data_module_from(checkpoint: dict, cls: type) -> object:
    """The data module of a checkpoint: its saved settings, then its saved state (vocabulary, statistics)."""
    settings = {k: v for k, v in checkpoint["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    data = cls(**settings)
    data.load_state_dict(checkpoint[cls.__name__])
    return data


def check_class_columns(header: list[str], rows: list[dict[str, str]], class_names: list[str]) -> torch.Tensor:
    """``prediction`` is the class with the highest ``prob_<class name>``, and the probabilities sum to 1."""
    assert header[1:] == ["prediction"] + [f"prob_{name}" for name in class_names]
    probs = torch.tensor([[float(row[f"prob_{name}"]) for name in class_names] for row in rows], dtype=torch.float64)
    assert torch.allclose(probs.sum(dim=1), torch.ones(len(rows), dtype=torch.float64), atol=1e-6)
    assert [row["prediction"] for row in rows] == [class_names[i] for i in probs.argmax(dim=1).tolist()]
    return probs


# --- text classification ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_run(clean_workdir) -> Path:
    """``configs/text_transformer.yaml`` fitted briefly on 200 keyword reviews (labels "neg"/"pos")."""
    with clean_workdir("text_run") as directory:
        write_csv(directory / "reviews.csv", keyword_rows(200, seed=3, max_words=12))
        main(["fit", "-c", str(TEXT), "--data.init_args.path", "reviews.csv", *SHORT_FIT])
    return directory


def test_a_new_text_file_without_labels_is_classified_row_by_row_in_file_order(text_run, monkeypatch):
    monkeypatch.chdir(text_run)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rng = random.Random(7)
    texts = [text for text, _ in keyword_rows(37, seed=99, min_words=1, max_words=40)]
    texts[3] = "Zyzzyva quokka EXCELLENT"  # unseen words become <unk>; case folded as in training
    texts[5] = " ".join(rng.choice(["excellent", "plot"]) for _ in range(90))  # longer than max_length (64)
    # no label field, another field of the user's: only the text field is read
    write_csv(text_run / "new.csv", [(f"id-{i}", text) for i, text in enumerate(texts)], fields=("ref", "text"))
    out = text_run / "text_predictions.csv"
    main([
        "predict", "-c", str(TEXT), "--data.init_args.path", "reviews.csv", "--ckpt_path", "best",
        "--data.init_args.predict_path", "new.csv", "--predictions_path", str(out),
    ])
    header, rows = read_predictions(out)
    assert header[0] == "row" and [int(row["row"]) for row in rows] == list(range(len(texts)))
    probs = check_class_columns(header, rows, ["neg", "pos"])

    # the model's own outputs on the same texts, encoded by the training pipeline with the checkpoint's vocabulary
    path = best_checkpoint(text_run, "text_transformer")
    checkpoint = torch.load(path, weights_only=True)
    data = data_module_from(checkpoint, TextClassificationDataModule)
    assert data.encode(texts[3]) == [data.unk_id, data.unk_id, data.vocabulary.stoi["excellent"]]
    assert len(data.encode(texts[5])) == 64
    module = ClassificationModule.load_from_checkpoint(path).eval()
    with torch.no_grad():
        expected = torch.cat([
            module.probabilities(module.logits({"input_ids": torch.tensor([data.encode(text)]),
                                                "attention_mask": torch.ones(1, len(data.encode(text)))}))
            for text in texts
        ])
    assert torch.allclose(probs, expected.double(), atol=1e-5)

    # the same texts as JSONL with a label field (ignored) give the same predictions
    write_jsonl(text_run / "new.jsonl", [(text, "not-a-class") for text in texts])
    data.predict_path = "new.jsonl"
    dataset, ids = data.new_data()
    assert ids == list(range(len(texts))) and "labels" not in dataset[0]
    batch = pad_collate([dataset[i] for i in range(len(texts))])
    with torch.no_grad():
        batched = module.probabilities(module.logits(batch))
    assert torch.allclose(batched.double(), probs, atol=1e-5)


def test_a_new_text_file_without_the_text_field_is_a_one_line_error(text_run, monkeypatch, capsys):
    monkeypatch.chdir(text_run)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    write_csv(text_run / "no_text.csv", [("a fine film",), ("boring",)], fields=("review",))
    with pytest.raises(SystemExit) as stop:
        main([
            "predict", "-c", str(TEXT), "--data.init_args.path", "reviews.csv", "--ckpt_path", "best",
            "--data.init_args.predict_path", "no_text.csv", "--predictions_path", "never.csv",
        ])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("recipes: error: ") and "'no_text.csv'" in err[-1]
    assert "the header has no field 'text'" in err[-1] and "['review']" in err[-1]
    assert not (text_run / "never.csv").exists()


# --- image folder ---------------------------------------------------------------------------------------------------
IMAGE_RECIPE = """\
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
    root: shapes
    image_size: [6, 5]
    batch_size: 8
    val_fraction: 0.25
"""
COLOURS = {"blue": (40, 60, 200), "green": (50, 190, 70), "red": (200, 50, 40)}


def colour_image(path: Path, colour: str, rng: np.random.Generator, size: tuple[int, int] = (9, 7)) -> Path:
    pixels = np.clip(np.array(COLOURS[colour]) + rng.normal(0, 40, (*size, 3)), 0, 255).astype(np.uint8)
    return save(path, pixels)


def test_a_new_folder_of_images_is_classified_file_by_file_in_path_order(workdir):
    rng = np.random.default_rng(0)
    for colour in COLOURS:
        for i in range(8):
            colour_image(workdir / "shapes" / colour / f"{i}.png", colour, rng)
    (workdir / "images_mlp.yaml").write_text(IMAGE_RECIPE)
    recipe = str(workdir / "images_mlp.yaml")
    main(["fit", "-c", recipe, "--trainer.limit_train_batches", "2"])

    # new images whose path order is not the class order; nested, upper-case suffix, a JPEG; hidden and other
    # files skipped
    new = workdir / "new"
    expected_paths = [
        colour_image(new / "a_red.png", "red", rng),
        colour_image(new / "b_blue.PNG", "blue", rng, size=(12, 4)),
        colour_image(new / "c_green.jpg", "green", rng),
        colour_image(new / "d" / "e_red.png", "red", rng),
        colour_image(new / "f_blue.png", "blue", rng),
    ]
    colour_image(new / ".hidden.png", "red", rng)
    colour_image(new / ".cache" / "g.png", "red", rng)
    (new / "notes.txt").write_text("not an image")
    out = workdir / "image_predictions.csv"
    main(["predict", "-c", recipe, "--ckpt_path", "best", "--data.init_args.predict_path", "new",
          "--predictions_path", str(out)])
    header, rows = read_predictions(out)
    ids = [str(Path("new") / p.relative_to(new)) for p in expected_paths]
    assert header[0] == "path" and [row["path"] for row in rows] == ids
    probs = check_class_columns(header, rows, ["blue", "green", "red"])

    # the model's own outputs on the same files prepared as val images, with the checkpoint's mean and std
    path = best_checkpoint(workdir, "images_mlp")
    checkpoint = torch.load(path, weights_only=True)
    data = data_module_from(checkpoint, ImageFolderDataModule)
    assert data.mean.tolist() == checkpoint["ImageFolderDataModule"]["mean"]
    prepared = ImageFolderDataset(ids, torch.zeros(len(ids)), (6, 5), 3, data.mean, data.std)
    images = torch.stack([prepared[i][0] for i in range(len(ids))])
    module = ClassificationModule.load_from_checkpoint(path).eval()
    with torch.no_grad():
        expected = module.probabilities(module.logits(images))
    assert torch.allclose(probs, expected.double(), atol=1e-5)

    # one image file works too; split predictions are identified by path as well
    data.predict_path = "new/c_green.jpg"
    single, single_ids = data.new_data()
    assert single_ids == ["new/c_green.jpg"] and torch.equal(single[0][0], images[2])
    data.predict_path = None
    data.setup()
    data.predict_dataloader()
    assert data.prediction_ids == data.datasets["val"].paths and data.id_name == "path"


# --- character language model -------------------------------------------------------------------------------------
def test_a_prompt_file_gets_one_generated_continuation_per_line(workdir):
    words = "the old miller walked to the river and sang a song of bread and stone".split()
    rng = random.Random(0)
    (workdir / "corpus.txt").write_text(" ".join(rng.choice(words) for _ in range(600)) + "\n", encoding="utf-8")
    (workdir / "prompts.txt").write_text("the old\n\nriver Ωand\r\nb\n", encoding="utf-8")
    common = ["-c", str(CHARLM), "--data.init_args.path", "corpus.txt", "--data.init_args.block_size", "16",
              "--model.init_args.model.init_args.d_model", "16", "--model.init_args.model.init_args.n_layers", "1"]
    main(["fit", *common, *SHORT_FIT])
    path = best_checkpoint(workdir, "charlm_gpt")
    checkpoint = torch.load(path, weights_only=True)
    assert "max_new_tokens" not in checkpoint["hyper_parameters"]  # a predict option: the command line decides

    out = workdir / "continuations.csv"
    main(["predict", *common, "--ckpt_path", "best", "--data.init_args.prompt_path", "prompts.txt",
          "--model.init_args.max_new_tokens", "12", "--model.init_args.top_k", "1", "--predictions_path", str(out)])
    header, rows = read_predictions(out)
    prompts = ["the old", "river Ωand", "b"]
    assert header == ["row", "prompt", "continuation"]
    assert [row["row"] for row in rows] == ["0", "2", "3"] and [row["prompt"] for row in rows] == prompts

    # generate() run directly on the prompts encoded with the checkpoint's vocabulary (Ω is <unk>)
    data = data_module_from(checkpoint, CharLMDataModule)
    assert data.encode("Ω") == [data.unk_id]
    module = LanguageModelModule.load_from_checkpoint(path)
    for prompt, row in zip(prompts, rows):
        ids = torch.tensor(data.encode(prompt))
        new_ids = module.generate(ids, 12, top_k=1)[len(ids):]
        assert len(new_ids) == 12 and row["continuation"] == data.decode(new_ids)

    # sampling (the default top_k null) repeats with the same seed, prompt by prompt whatever the batch
    encoded = [torch.tensor(data.encode(prompt)) for prompt in prompts]
    module.max_new_tokens, module.sample_seed = 20, 5
    first = module.continue_prompts(encoded, torch.tensor([0, 2, 3]))
    assert torch.equal(module.continue_prompts(encoded[1:], torch.tensor([2, 3])), first[1:])
    module.sample_seed = 6
    assert not torch.equal(module.continue_prompts(encoded, torch.tensor([0, 2, 3])), first)

    # without a prompt file predict stays what it was: the most likely next character of every val window position
    windows = workdir / "windows.csv"
    main(["predict", *common, "--ckpt_path", "best", "--predictions_path", str(windows)])
    header, rows = read_predictions(windows)
    assert header == ["row"] + [f"output_{i}" for i in range(16)] and len(rows) > 0


# --- tabular: the reference implementation of predict_path ----------------------------------------------------------
def test_a_new_table_uses_the_restored_encoding_and_a_missing_feature_column_is_named(tmp_path):
    from datamodules import TabularDataModule
    from tests.data_files import make_frame, write

    train = str(write(make_frame(), tmp_path / "train.csv"))
    fitted = TabularDataModule(train, target="label", seed=2)
    fitted.setup("fit")
    new = make_frame(6, seed=1).drop(columns=["label"])  # no target column
    new.loc[0, "color"] = "purple"  # a category unseen in training: the <unknown> slot, as in training
    write(new, tmp_path / "new.csv")
    restored = TabularDataModule(train, target="label", seed=2, predict_path=str(tmp_path / "new.csv"))
    restored.load_state_dict(fitted.state_dict())
    dataset, ids = restored.new_data()
    assert ids == list(range(6)) and restored.datasets == {}  # the training file was not read again
    assert torch.equal(dataset.tensors[0], fitted.encoder.transform(new))
    assert dataset.tensors[0][0, fitted.feature_names.index("color=<unknown>")] == 1.0

    write(new.drop(columns=["x2"]), tmp_path / "no_x2.csv")
    restored.predict_path = str(tmp_path / "no_x2.csv")
    with pytest.raises(ValueError, match=r"no_x2.csv' lacks the feature column\(s\) \['x2'\] the model was trained on"):
        restored.new_data()
