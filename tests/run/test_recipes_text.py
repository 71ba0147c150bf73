"""The text recipes: shipped data equals its generator, both YAMLs run, and full runs reach their targets.

``configs/text_transformer.yaml`` (review sentiment, data/reviews.csv) and ``configs/charlm_gpt.yaml``
(character LM, data/tiny_corpus.txt), run in-process through ``recipes.cli.main`` in a temporary directory
whose ``data`` is a link to the repository's.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml

from datamodules import CharLMDataModule, TextClassificationDataModule
from datamodules.tokenizers import Vocabulary
from lightning_modules import LanguageModelModule
from recipes.cli import main
from recipes.run.recipes_cli import RecipesCLI
from tests.conftest import CONFIGS, REPO, mlflow_client, runs_of

DATA = REPO / "data"
TEXT = CONFIGS / "text_transformer.yaml"
CHARLM = CONFIGS / "charlm_gpt.yaml"


def load_generator():
    """``data/make_text_data.py`` as a module (``data`` is not a package)."""
    spec = importlib.util.spec_from_file_location("make_text_data", DATA / "make_text_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def data_args(recipe: Path) -> dict:
    """The recipe's ``data.init_args`` with the path made absolute."""
    args = dict(yaml.safe_load(recipe.read_text())["data"]["init_args"])
    args["path"] = str(REPO / args["path"])
    return args


def model_args(recipe: Path) -> dict:
    return yaml.safe_load(recipe.read_text())["model"]["init_args"]


@pytest.fixture
def recipe_dir(workdir: Path) -> Path:
    """The test's working directory with ``data`` linked to the repository's: recipes name ``data/...``."""
    (workdir / "data").symlink_to(DATA)
    return workdir


def test_shipped_data_matches_the_generator():
    gen = load_generator()
    reviews = gen.make_reviews(gen.N_REVIEWS, gen.REVIEWS_SEED)
    assert gen.reviews_csv(reviews).encode("utf-8") == (DATA / "reviews.csv").read_bytes()
    corpus = gen.make_corpus(gen.CORPUS_CHARS, gen.CORPUS_SEED)
    assert corpus.encode("utf-8") == (DATA / "tiny_corpus.txt").read_bytes()
    # the sizes and proportions the recipes and their documentation rely on
    assert len(reviews) == 4000 and (DATA / "reviews.csv").stat().st_size < 400_000
    counts = Counter(label for _, label in reviews)
    assert set(counts) == {"positive", "negative", "neutral"}
    assert counts["positive"] > counts["negative"] > counts["neutral"] > 0.15 * len(reviews)
    assert 60_000 <= len(corpus) <= 120_000 and corpus.endswith("\n")
    # deterministic per seed, different across seeds
    assert gen.make_reviews(50, 1) == gen.make_reviews(50, 1) != gen.make_reviews(50, 2)
    assert gen.make_corpus(2000, 1) != gen.make_corpus(2000, 2)


@pytest.mark.parametrize("recipe", [TEXT, CHARLM], ids=lambda p: p.stem)
def test_text_recipe_runs_with_fast_dev_run_with_sizes_from_the_data(recipe_dir, recipe):
    cli = RecipesCLI(args=["fit", "-c", str(recipe), "--trainer.fast_dev_run", "1"])
    assert runs_of(recipe_dir, recipe.stem) == []  # fast_dev_run tracks nothing
    network, data = cli.model.model, cli.datamodule
    if recipe == TEXT:  # the vocabulary's real size (not max_vocab_size), the classes and the truncation length
        assert (network.vocab_size, network.num_classes, cli.model.num_classes) == (data.vocab_size, 3, 3)
        assert data.vocab_size < data_args(TEXT)["max_vocab_size"] and network.max_length == 64
    else:  # the corpus's characters plus <unk>, and the context length
        assert (network.vocab_size, cli.model.vocab_size, network.block_size) == (46, 46, 64) == (
            data.vocab_size, data.vocab_size, data.block_size)


def majority_rate_of_test_split() -> float:
    data = TextClassificationDataModule(**data_args(TEXT))
    data.setup("test")
    labels = data.datasets["test"].labels
    return torch.bincount(labels).max().item() / len(labels)


@pytest.mark.slow
def test_text_transformer_beats_the_majority_class_clearly(recipe_dir):
    start = time.perf_counter()
    main(["fit", "-c", str(TEXT)])
    main(["test", "-c", str(TEXT), "--ckpt_path", "best"])
    runs = runs_of(recipe_dir, "text_transformer")
    assert [r.data.tags["loopwise.stage"] for r in runs] == ["fit", "test"]
    assert all(r.info.status == "FINISHED" for r in runs)
    accuracy = runs[1].data.metrics["test/acc"]
    majority = majority_rate_of_test_split()  # 0.4375 (175 of 400 test reviews are positive)
    print(f"text_transformer: test acc {accuracy:.4f}, majority {majority:.4f}, {time.perf_counter() - start:.0f} s")
    # measured: 0.835 with seed_everything 0 (0.8575 and 0.885 with seeds 1 and 2, test of the last checkpoint);
    # a bag-of-words logistic regression gets about 0.69 on the same split. The spread over seeds is issue 18's.
    assert accuracy >= majority + 0.2
    assert accuracy >= 0.82


def unigram_entropy(text: str) -> float:
    """Entropy in nats of the character frequencies of ``text``."""
    counts = Counter(text)
    return -sum(n / len(text) * math.log(n / len(text)) for n in counts.values())


@pytest.mark.slow
def test_charlm_gpt_beats_unigram_entropy_and_generates_deterministically(recipe_dir):
    start = time.perf_counter()
    main(["fit", "-c", str(CHARLM)])
    runs = runs_of(recipe_dir, "charlm_gpt")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run_id = runs[0].info.run_id
    client = mlflow_client(recipe_dir)
    best_loss = min(m.value for m in client.get_metric_history(run_id, "val/loss"))
    best_ppl = min(m.value for m in client.get_metric_history(run_id, "val/ppl"))
    # the entropy of the val part (the last 10% of the corpus), the text the val loss is measured on: 3.00 nats
    data = CharLMDataModule(**data_args(CHARLM))
    data.setup("fit")
    text = data.read_text()
    entropy = unigram_entropy(text[data.boundary :])
    elapsed = time.perf_counter() - start
    print(f"charlm_gpt: best val loss {best_loss:.4f} (ppl {best_ppl:.3f}), entropy {entropy:.4f}, {elapsed:.0f} s")
    assert best_ppl == pytest.approx(math.exp(best_loss), rel=1e-3)
    # measured: 0.91, about 2.1 nats below the unigram entropy
    assert best_loss <= entropy - 1.0

    # the best checkpoint alone rebuilds the network and holds the vocabulary to encode a prompt with
    ckpt = recipe_dir / "checkpoints" / "charlm_gpt" / run_id / "best.ckpt"
    module = LanguageModelModule.load_from_checkpoint(ckpt)
    vocabulary = Vocabulary.from_state_dict(torch.load(ckpt, weights_only=True)["CharLMDataModule"]["vocabulary"])
    assert vocabulary == data.vocabulary
    prompt = torch.tensor(vocabulary.encode("The old miller "))
    first = module.generate(prompt, 100, top_k=1)
    second = module.generate(prompt, 100, top_k=1)
    assert torch.equal(first, second)
    assert first.shape == (len(prompt) + 100,) and torch.equal(first[: len(prompt)], prompt)
    sample = "".join(vocabulary.decode(first.tolist()))
    assert "<unk>" not in sample
    assert len(set(sample.split()) & set(text.split())) >= 5  # it writes words of the corpus
