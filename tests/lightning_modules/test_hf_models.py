"""Hugging Face networks and tokenizers (issue 18, part 4): ``HFSequenceClassifier`` and ``HFCausalLM``, the text data
modules with ``tokenizer: <a Hugging Face tokenizer>``, and ``configs/text_finetune_hf.yaml`` end to end through the
``recipes`` command, all on tiny models and tokenizers built and saved locally (``tests/hf_models.py``): nothing is
downloaded (HF_HUB_OFFLINE=1, set in conftest.py)."""

from __future__ import annotations

import csv
import math
import os
import sys
from pathlib import Path

import pytest
import torch

from datamodules import CharLMDataModule, TextClassificationDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import HFCausalLM, HFSequenceClassifier
from recipes.cli import main
from tests.preloaded_python import LIBRARIES, preloaded_run
from tests.conftest import CONFIGS, REPO, mlflow_client, runs_of
from tests.hf_models import BERT_MAX_LENGTH, build_tiny_bert, hf_overrides, local_hf_models

RECIPE = CONFIGS / "text_finetune_hf.yaml"
REVIEWS = str(REPO / "data" / "reviews.csv")
CORPUS = str(REPO / "data" / "tiny_corpus.txt")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="session")
def hf_dirs() -> dict[str, Path]:
    return local_hf_models()


def tokenizer_of(directory: Path, **kwargs):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True, **kwargs)


def test_the_tests_never_reach_the_hub():
    import huggingface_hub.constants

    assert huggingface_hub.constants.HF_HUB_OFFLINE is True


# --- the networks -------------------------------------------------------------------------------------------------
def test_sequence_classifier_loads_the_body_replaces_the_head_and_ignores_padding(hf_dirs):
    from transformers import BertForSequenceClassification

    saved = BertForSequenceClassification.from_pretrained(hf_dirs["bert"], local_files_only=True)  # a 2-label head
    net = HFSequenceClassifier(str(hf_dirs["bert"]), num_classes=3, vocab_size=301, max_length=40)
    assert net.training and all(m.training for m in net.modules())  # from_pretrained's eval mode undone
    assert (net.vocab_size, net.max_length, net.num_classes) == (301, 40, 3)
    body = "bert.encoder.layer.1.output.dense.weight"
    assert torch.equal(net.model.state_dict()[body], saved.state_dict()[body])  # pretrained body loaded
    assert net.model.classifier.weight.shape == (3, 32)  # new head for 3 classes
    net.eval()
    ids = torch.tensor([[2, 40, 41, 42, 3], [2, 50, 3, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        batch = net(input_ids=ids, attention_mask=mask)
        alone = net(input_ids=ids[1:, :3], attention_mask=mask[1:, :3])
    assert batch.shape == (2, 3)
    assert torch.allclose(batch[1], alone[0], atol=1e-5)  # the padded row gives the logits of the text alone


def test_sequence_classifier_sizes_grow_the_embedding_or_are_refused(hf_dirs):
    grown = HFSequenceClassifier(str(hf_dirs["bert"]), num_classes=2, vocab_size=305)  # 4 tokens added
    assert grown.model.get_input_embeddings().weight.shape == (305, 32) and grown.vocab_size == 305
    smaller = HFSequenceClassifier(str(hf_dirs["bert"]), num_classes=2, vocab_size=250)
    assert smaller.model.get_input_embeddings().weight.shape == (301, 32)  # unused rows left alone
    assert HFSequenceClassifier(str(hf_dirs["bert"]), num_classes=2).max_length == BERT_MAX_LENGTH
    with pytest.raises(ValueError, match=f"max_length=100 is longer than .* can take \\({BERT_MAX_LENGTH} positions"):
        HFSequenceClassifier(str(hf_dirs["bert"]), num_classes=2, max_length=100)


def test_causal_lm_logits_follow_the_tokenizer_size_and_block_size(hf_dirs):
    path = str(hf_dirs["gpt2"])
    torch.manual_seed(0)
    ids = torch.randint(0, 290, (2, 10))
    full = HFCausalLM(path, vocab_size=300, block_size=32).eval()
    assert full.block_size == 32 and HFCausalLM(path).block_size == 64  # the model's 64 positions by default
    cut = HFCausalLM(path, vocab_size=290).eval()  # a tokenizer smaller than the model's embedding
    with torch.no_grad():
        logits = full(ids)
        assert logits.shape == (2, 10, 300)
        assert torch.equal(cut(ids), logits[..., :290])
    grown = HFCausalLM(path, vocab_size=310)
    assert grown(ids).shape == (2, 10, 310)
    assert grown.model.get_output_embeddings().weight is grown.model.get_input_embeddings().weight  # still tied
    with pytest.raises(ValueError, match="block_size=65 is longer than .* can take \\(64 positions\\)"):
        HFCausalLM(path, block_size=65)
    with pytest.raises(ValueError, match="sequence length 33 exceeds block_size=32"):
        full(torch.zeros(1, 33, dtype=torch.long))


def test_a_model_that_cannot_be_loaded_is_one_line(tmp_path):
    with pytest.raises(ValueError) as missing:
        HFSequenceClassifier(str(tmp_path / "nowhere"), num_classes=2)
    assert str(missing.value) == f"HFSequenceClassifier: model directory '{tmp_path / 'nowhere'}' does not exist (or is not a directory)"
    with pytest.raises(ValueError) as unknown:
        HFCausalLM("nobody-here/no-such-model")
    text = str(unknown.value)
    assert "\n" not in text and text.startswith("HFCausalLM: cannot load 'nobody-here/no-such-model': it is neither")


def test_without_transformers_each_part_says_what_to_install(monkeypatch, workdir, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` now fails as if not installed
    install = 'pip install "loopwise[hf]"'
    with pytest.raises(ValueError) as network:
        HFCausalLM("gpt2")
    assert str(network.value) == f"HFCausalLM needs Hugging Face transformers, which is not installed: {install}"
    with pytest.raises(ValueError) as tokenizer:
        TextClassificationDataModule(REVIEWS, tokenizer="bert-base-uncased")
    assert str(tokenizer.value) == (
        "TextClassificationDataModule: unknown tokenizer 'bert-base-uncased': not one of ['char', 'word'], and a "
        f"Hugging Face tokenizer (a local directory or hub name) needs transformers, which is not installed: {install}"
    )
    (workdir / "data").symlink_to(REPO / "data")
    with pytest.raises(SystemExit) as exc:  # the word tokenizer needs no transformers: the network says it
        main(["fit", "-c", str(RECIPE), "--data.init_args.tokenizer", "word", "--trainer.fast_dev_run", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"recipes: error: HFSequenceClassifier needs Hugging Face transformers, which is not installed: {install}"


# --- the data modules ---------------------------------------------------------------------------------------------
def test_text_batches_are_the_tokenizers_ids_with_its_specials_padding_and_length(hf_dirs):
    tokenizer = tokenizer_of(hf_dirs["bert"])
    data = TextClassificationDataModule(REVIEWS, tokenizer=str(hf_dirs["bert"]), max_length=64, batch_size=16)
    data.setup("fit")
    assert (data.vocab_size, data.pad_id, data.unk_id, data.max_length) == (301, 0, 1, BERT_MAX_LENGTH)  # 64 capped
    dataset = data.datasets["train"]
    texts = [data.load()[0][i] for i in data.split_rows["train"][:16].tolist()]
    expected = [tokenizer(t, truncation=True, max_length=BERT_MAX_LENGTH)["input_ids"] for t in texts]
    assert [dataset[i]["input_ids"].tolist() for i in range(16)] == expected
    batch = next(iter(data.val_dataloader()))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    lengths = mask.sum(dim=1)
    assert (ids[:, 0] == tokenizer.cls_token_id).all()  # [CLS] first, [SEP] last, padding after it
    assert (ids[torch.arange(len(ids)), lengths - 1] == tokenizer.sep_token_id).all()
    assert (ids[mask == 0] == 0).all() and mask[:, 0].all() and ids.shape[1] == int(lengths.max())
    short = TextClassificationDataModule(REVIEWS, tokenizer=str(hf_dirs["bert"]), max_length=6)
    long_text = "the plot was great but the acting was not " * 5
    assert short.encode(long_text) == tokenizer(long_text, truncation=True, max_length=6)["input_ids"]
    assert len(short.encode(long_text)) == 6 and short.encode(long_text)[-1] == tokenizer.sep_token_id


def test_a_tokenizer_without_padding_token_pads_with_its_end_id_on_its_side(hf_dirs, tmp_path):
    tokenizer = tokenizer_of(hf_dirs["gpt2"], padding_side="left")  # saved with it (an attribute set later is not)
    assert tokenizer.pad_token_id is None
    tokenizer.save_pretrained(tmp_path / "left")
    data = TextClassificationDataModule(REVIEWS, tokenizer=str(tmp_path / "left"), batch_size=8)
    data.setup("fit")
    assert (data.pad_id, data.max_length, data.vocab_size) == (tokenizer.eos_token_id, 64, 300)
    batch = next(iter(data.val_dataloader()))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert mask[:, -1].all() and not mask[:, 0].all()  # padding before the text
    for row in range(len(ids)):
        real = ids[row][mask[row] == 1].tolist()
        assert real == data.encode(data.load()[0][int(data.split_rows["val"][row])])
        assert (ids[row][mask[row] == 0] == tokenizer.eos_token_id).all()


def test_the_checkpoint_state_names_the_tokenizer_and_refuses_another(hf_dirs, tmp_path):
    data = TextClassificationDataModule(REVIEWS, tokenizer=str(hf_dirs["bert"]))
    data.setup("fit")
    state = data.state_dict()
    assert state == {
        "class_names": ["negative", "neutral", "positive"], "tokenizer": str(hf_dirs["bert"]), "tokenizer_size": 301,
    }
    with pytest.raises(ValueError, match=f"trained with tokenizer='{hf_dirs['bert']}', but this module has tokenizer='word'"):
        TextClassificationDataModule(REVIEWS, tokenizer="word").load_state_dict(state)
    word = TextClassificationDataModule(REVIEWS)
    word.setup("fit")
    with pytest.raises(ValueError, match="trained with tokenizer='word'"):
        data.load_state_dict(word.state_dict())
    grown = tokenizer_of(hf_dirs["bert"])
    grown.add_tokens(["zyzzyva", "quokka"])
    grown.save_pretrained(tmp_path / "grown")
    state["tokenizer"] = str(tmp_path / "grown")
    with pytest.raises(ValueError, match="has 303 tokens now, but the checkpoint was trained when it had 301"):
        TextClassificationDataModule(REVIEWS, tokenizer=str(tmp_path / "grown")).load_state_dict(state)
    with pytest.raises(ValueError, match="min_freq and max_vocab_size shape the vocabulary"):
        TextClassificationDataModule(REVIEWS, tokenizer=str(hf_dirs["bert"]), max_vocab_size=100)


def test_an_unknown_tokenizer_is_one_line(tmp_path):
    with pytest.raises(ValueError) as missing:
        TextClassificationDataModule(REVIEWS, tokenizer=str(tmp_path / "no_tokenizer"))
    assert str(missing.value) == (
        f"TextClassificationDataModule: tokenizer directory '{tmp_path / 'no_tokenizer'}' does not exist (or is not "
        "a directory)"
    )
    with pytest.raises(ValueError) as unknown:
        CharLMDataModule(CORPUS, tokenizer="bpe-of-nobody")
    text = str(unknown.value)
    assert "\n" not in text and text.startswith(
        "CharLMDataModule: unknown tokenizer 'bpe-of-nobody': not one of ['char', 'word'], nor a local directory"
    )
    with pytest.raises(ValueError, match="tokenizer 'word' would lose the text's spacing"):
        CharLMDataModule(CORPUS, tokenizer="word")


def test_lm_windows_are_token_streams_of_each_part(hf_dirs):
    tokenizer = tokenizer_of(hf_dirs["gpt2"])
    data = CharLMDataModule(CORPUS, block_size=32, tokenizer=str(hf_dirs["gpt2"]), batch_size=8)
    data.setup("fit")
    text = data.read_text()
    train_ids = tokenizer(text[: data.boundary], add_special_tokens=False)["input_ids"]
    val_ids = tokenizer(text[data.boundary :], add_special_tokens=False)["input_ids"]
    assert data.vocab_size == 300 and data.datasets["train"].data.tolist() == train_ids
    assert data.datasets["val"].data.tolist() == val_ids
    assert len(data.datasets["train"]) == (len(train_ids) - 33) // 32 + 1
    x, y = next(iter(data.val_dataloader()))
    assert x.shape == y.shape == (8, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert data.decode(data.encode("The old miller ")) == "The old miller "
    assert data.state_dict() == {"tokenizer": str(hf_dirs["gpt2"]), "tokenizer_size": 300}


# --- through the recipes command ----------------------------------------------------------------------------------
LM_RECIPE = """\
seed_everything: 0
trainer:
  max_epochs: 2
  limit_train_batches: 30
  log_every_n_steps: 1
model:
  class_path: lightning_modules.LanguageModelModule
  init_args:
    model:
      class_path: lightning_modules.models.HFCausalLM
      init_args: {{name_or_path: {model}}}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {{lr: 0.003}}
data:
  class_path: datamodules.CharLMDataModule
  init_args: {{path: {corpus}, tokenizer: {model}, block_size: 32, batch_size: 16, seed: 0}}
"""


@pytest.mark.slow
def test_a_causal_lm_with_a_hf_tokenizer_fits_and_continues_prompts(workdir, hf_dirs):
    (workdir / "lm.yaml").write_text(LM_RECIPE.format(model=hf_dirs["gpt2"], corpus=CORPUS))
    main(["fit", "-c", "lm.yaml"])
    (run,) = runs_of(workdir, "lm")
    assert run.info.status == "FINISHED"
    assert run.data.tags["doctor.findings"] == "none"  # first loss ln(300) = 5.70 as expected for a fresh model
    client = mlflow_client(workdir)
    train = [m.value for m in client.get_metric_history(run.info.run_id, "train/loss")]
    val = [m.value for m in client.get_metric_history(run.info.run_id, "val/loss")]
    print(f"hf causal lm: first train loss {train[0]:.3f}, val loss {val[0]:.3f} then {val[1]:.3f}")
    assert abs(train[0] - math.log(300)) < 0.3
    # measured: 4.09 then 3.58 nats per token (a uniform guess: ln(300) = 5.70)
    assert len(val) == 2 and val[0] < math.log(300) - 1.0 and val[1] < val[0] - 0.3
    (workdir / "prompts.txt").write_text("The old miller\n\nJoss and Katya\n")
    main(["predict", "-c", "lm.yaml", "--ckpt_path", "best", "--data.init_args.prompt_path", "prompts.txt",
          "--model.init_args.max_new_tokens", "8", "--model.init_args.top_k", "1", "--predictions_path", "out.csv"])
    with (workdir / "out.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["row"], r["prompt"]) for r in rows] == [("0", "The old miller"), ("2", "Joss and Katya")]
    assert all(len(tokenizer_of(hf_dirs["gpt2"])(r["continuation"])["input_ids"]) >= 4 for r in rows)


def fresh_process_logits(checkpoint: Path, texts: list[str], out: Path) -> None:
    """Rebuild the task and the data module from ``checkpoint`` alone in a new Python process and save the logits of
    ``texts`` to ``out``, on as many torch threads as this process uses now (the test compares them bit for bit)."""
    script = f"""
import torch
torch.set_num_threads({torch.get_num_threads()})
from datamodules import TextClassificationDataModule
from datamodules.collate import pad_collate
from lightning_modules import ClassificationModule
checkpoint = torch.load({str(checkpoint)!r}, weights_only=True)
settings = {{k: v for k, v in checkpoint["datamodule_hyper_parameters"].items() if not k.startswith("_")}}
data = TextClassificationDataModule(**settings)
data.load_state_dict(checkpoint["TextClassificationDataModule"])
module = ClassificationModule.load_from_checkpoint({str(checkpoint)!r}).eval()
batch = pad_collate([{{"input_ids": data.encode(text)}} for text in {texts!r}], pad_id=data.pad_id)
with torch.no_grad():
    torch.save(module.logits(batch), {str(out)!r})
"""
    # a process that never imported loopwise (forked from one that imported only the libraries)
    out = preloaded_run([sys.executable, "-c", script], cwd=REPO, env=dict(os.environ), timeout=300, preload=LIBRARIES)
    assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow
def test_the_finetune_recipe_fits_tests_predicts_and_reloads_in_a_fresh_process(workdir, hf_dirs):
    (workdir / "data").symlink_to(REPO / "data")
    local = hf_overrides(RECIPE)
    assert local == ["--model.init_args.model.init_args.name_or_path", str(hf_dirs["bert"]),
                     "--data.init_args.tokenizer", str(hf_dirs["bert"])]
    # a randomly initialized tiny BERT learns slowly: a larger learning rate than the hub model's
    short = ["--trainer.max_epochs", "4", "--model.init_args.optimizer.init_args.lr", "0.01"]
    main(["fit", "-c", str(RECIPE), *local, *short])
    main(["test", "-c", str(RECIPE), *local, *short, "--ckpt_path", "best"])
    texts = ["A wonderful film, I loved it.", "Boring and far too long.", "It was fine, nothing special.",
             "The acting was great, but the plot was weak.", "zyzzyva quokka"]
    with (workdir / "new.csv").open("w", newline="") as handle:
        csv.writer(handle).writerows([["text"], *[[t] for t in texts]])
    main(["predict", "-c", str(RECIPE), *local, *short, "--ckpt_path", "best",
          "--data.init_args.predict_path", "new.csv", "--predictions_path", "predictions.csv"])
    fit, test, predict = runs_of(workdir, "text_finetune_hf")
    assert [r.info.status for r in (fit, test, predict)] == ["FINISHED"] * 3
    assert fit.data.params["network"] == "HFSequenceClassifier" and fit.data.params["plan.batches_per_epoch"] == "44"
    assert fit.data.tags["doctor.findings"] == "none"
    print(f"text_finetune_hf (tiny local BERT): val acc {fit.data.metrics['val/acc']:.4f}, test acc "
          f"{test.data.metrics['test/acc']:.4f}")
    # measured: val acc 0.697 after 4 epochs, test acc 0.6725 (best checkpoint); the majority class is 0.44
    assert fit.data.metrics["val/acc"] >= 0.6 and test.data.metrics["test/acc"] >= 0.6
    with (workdir / "predictions.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["row"]) for r in rows] == list(range(5))
    names = ["negative", "neutral", "positive"]
    probs = torch.tensor([[float(r[f"prob_{n}"]) for n in names] for r in rows], dtype=torch.float64)
    assert [r["prediction"] for r in rows] == [names[i] for i in probs.argmax(dim=1).tolist()]

    # the best checkpoint alone rebuilds network, tokenizer and classes in a new process, with identical outputs
    (checkpoint,) = (workdir / "checkpoints" / "text_finetune_hf").glob(f"{fit.info.run_id}/best.ckpt")
    fresh_process_logits(checkpoint, texts, workdir / "fresh.pt")
    fresh = torch.load(workdir / "fresh.pt", weights_only=True)
    saved = torch.load(checkpoint, weights_only=True)
    data = TextClassificationDataModule(
        **{k: v for k, v in saved["datamodule_hyper_parameters"].items() if not k.startswith("_")}
    )
    data.load_state_dict(saved["TextClassificationDataModule"])
    module = ClassificationModule.load_from_checkpoint(checkpoint).eval()
    from datamodules.collate import pad_collate

    batch = pad_collate([{"input_ids": data.encode(t)} for t in texts], pad_id=data.pad_id)
    with torch.no_grad():
        here = module.logits(batch)
    assert fresh.shape == (5, 3) and torch.equal(fresh, here)
    assert torch.allclose(here.double().softmax(dim=1), probs, atol=1e-6)  # what `recipes predict` wrote


def test_a_tokenizer_state_of_another_size_is_refused_by_a_recipe_evaluation(workdir, hf_dirs, tmp_path, capsys):
    """A checkpoint's tokenizer rewritten with more tokens: `recipes test` stops with one line before running."""
    (workdir / "data").symlink_to(REPO / "data")
    bert = build_tiny_bert(tmp_path / "bert")  # a copy the test may rewrite
    local = ["--model.init_args.model.init_args.name_or_path", str(bert), "--data.init_args.tokenizer", str(bert)]
    tiny = ["--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    main(["fit", "-c", str(RECIPE), *local, *tiny])
    tokenizer = tokenizer_of(bert)
    tokenizer.add_tokens(["zyzzyva"])
    tokenizer.save_pretrained(bert)
    with pytest.raises(SystemExit) as exc:
        main(["test", "-c", str(RECIPE), *local, *tiny, "--ckpt_path", "best"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("recipes: error: ") and "has 302 tokens now, but the checkpoint was trained when it had 301" in err
