"""Tiny Hugging Face models and tokenizers built and saved locally, standing in for hub models in tests (nothing is
downloaded: the tests run with HF_HUB_OFFLINE=1, see conftest.py).

``local_hf_models()`` builds, once per process, a tiny BERT sequence classifier with a WordPiece tokenizer of the
words of data/reviews.csv, and a tiny GPT-2 with a byte-level BPE tokenizer trained on data/tiny_corpus.txt, each saved
with ``save_pretrained`` (model and tokenizer in one directory). ``hf_overrides(recipe)`` gives the command-line
overrides that point a recipe naming a hub model at them.
"""

from __future__ import annotations

import atexit
import csv
import functools
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
HF_NETWORKS = {
    "lightning_modules.models.HFSequenceClassifier": "bert",
    "lightning_modules.models.hf.HFSequenceClassifier": "bert",
    "lightning_modules.models.HFCausalLM": "gpt2",
    "lightning_modules.models.hf.HFCausalLM": "gpt2",
}
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
BERT_MAX_LENGTH = 48  # the tokenizer's model_max_length and the model's position embeddings
GPT2_POSITIONS = 64


def review_texts() -> list[str]:
    with (REPO / "data" / "reviews.csv").open(encoding="utf-8", newline="") as handle:
        return [row["text"] for row in csv.DictReader(handle)]


def wordpiece_vocabulary(texts: list[str], normalizer: Any, pre_tokenizer: Any) -> dict[str, int]:
    """A deterministic WordPiece vocabulary (``tokenizers``' trainer breaks ties differently from run to run): the
    special tokens, every character alone and as a continuation (``##c``), then the words seen at least twice, by
    descending count, ties alphabetically; rarer words are spelled with pieces."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)))
    chars = sorted({c for word in counts for c in word})
    words = [w for w, n in sorted(counts.items(), key=lambda item: (-item[1], item[0])) if n >= 2 and len(w) > 1]
    tokens = [*BERT_SPECIALS, *chars, *(f"##{c}" for c in chars), *words]
    return {token: i for i, token in enumerate(dict.fromkeys(tokens))}


def build_tiny_bert(directory: Path, num_labels: int = 2, seed: int = 0) -> Path:
    """A 2-layer BERT (width 32, 2 heads, ``BERT_MAX_LENGTH`` positions) with an uncased WordPiece tokenizer of the
    reviews' words (``[CLS] text [SEP]``, ``[PAD]`` = 0), saved to ``directory``; the head has ``num_labels``
    outputs."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=True), pre_tokenizers.BertPreTokenizer()
    tok = Tokenizer(models.WordPiece(wordpiece_vocabulary(review_texts(), normalizer, pre_tokenizer), unk_token="[UNK]"))
    tok.normalizer, tok.pre_tokenizer = normalizer, pre_tokenizer
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.decoder = decoders.WordPiece()
    tokenizer = BertTokenizerFast(tokenizer_object=tok, model_max_length=BERT_MAX_LENGTH)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=BERT_MAX_LENGTH, num_labels=num_labels, pad_token_id=tokenizer.pad_token_id,
    )
    directory.mkdir(parents=True, exist_ok=True)
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_tiny_gpt2(directory: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 (width 32, 2 heads, 64 positions) with a byte-level BPE tokenizer of 300 ids trained on
    data/tiny_corpus.txt (no padding token: ``<|endoftext|>`` is its BOS, EOS and UNK), saved to ``directory``."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([(REPO / "data" / "tiny_corpus.txt").read_text(encoding="utf-8")], trainer)
    end = "<|endoftext|>"
    tokenizer = GPT2TokenizerFast(
        tokenizer_object=tok, bos_token=end, eos_token=end, unk_token=end, model_max_length=GPT2_POSITIONS
    )
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=GPT2_POSITIONS, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    directory.mkdir(parents=True, exist_ok=True)
    GPT2LMHeadModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@functools.lru_cache(maxsize=None)
def local_hf_models() -> dict[str, Path]:
    """``{"bert": directory, "gpt2": directory}``, built once per process in a temporary directory."""
    root = Path(tempfile.mkdtemp(prefix="loopwise-hf-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return {"bert": build_tiny_bert(root / "bert"), "gpt2": build_tiny_gpt2(root / "gpt2")}


def hf_overrides(recipe: Path) -> list[str]:
    """Overrides that point a recipe's Hugging Face network and tokenizer at the local tiny ones (none for a
    recipe without a Hugging Face network)."""
    config = yaml.safe_load(Path(recipe).read_text())
    network = ((config.get("model") or {}).get("init_args") or {}).get("model") or {}
    kind = HF_NETWORKS.get(network.get("class_path", ""))
    if kind is None:
        if network.get("class_path", "").rsplit(".", 1)[-1] == "HFImageClassifier":
            return hf_image_overrides()
        return []
    local = str(local_hf_models()[kind])
    args = ["--model.init_args.model.init_args.name_or_path", local]
    data = (config.get("data") or {}).get("init_args") or {}
    if data.get("tokenizer") not in (None, "word", "char"):
        args += ["--data.init_args.tokenizer", local]
    return args


def hf_image_overrides(family: str = "resnet") -> list[str]:
    """Overrides that point an image recipe's Hugging Face network, its image processor and its folder at a tiny
    local model of ``family`` (``tests/hf_image_models.py``) and a small folder of digit images (12 per class), in
    batches of 8 (10 train batches, 3 val: the host-sync test counts ordinary batches)."""
    from tests.hf_image_models import local_digits_folder, local_hf_image_models

    local = str(local_hf_image_models()[family])
    return [
        "--model.init_args.model.init_args.name_or_path", local,
        "--data.init_args.image_processor", local,
        "--data.init_args.root", str(local_digits_folder()),
        "--data.init_args.batch_size", "8",
    ]
