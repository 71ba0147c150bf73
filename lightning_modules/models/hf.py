"""Pretrained Hugging Face networks (the optional extra ``loopwise[hf]``): a sequence classifier and a causal language
model, loaded with ``transformers``' ``from_pretrained`` and shaped like loopwise's own networks (token ids and an
attention mask in, a logits tensor out, sizes linked from the data).

``transformers`` is imported when one of them is built, never when ``lightning_modules.models`` is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

HF_EXTRA = 'pip install "loopwise[hf]"'
# what AutoConfig calls the longest input a model's position embeddings cover, by model family
POSITION_LIMITS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")


class HFExtraMissing(ValueError):
    """``transformers`` is not installed: a ``ValueError`` like any other bad configuration value, so the recipes
    command reports it as one line (jsonargparse would turn an ``ImportError`` raised while building a class into
    "Problem with given class_path" and lose the message); catch it by this name."""


def import_transformers(what: str) -> Any:
    """The ``transformers`` module, or ``HFExtraMissing`` whose one line says what to install."""
    try:
        import transformers
    except ImportError:
        raise HFExtraMissing(f"{what} needs Hugging Face transformers, which is not installed: {HF_EXTRA}") from None
    return transformers


def load_pretrained(auto_class: Any, name_or_path: str, what: str, revision: str | None, **kwargs: Any) -> Any:
    """``auto_class.from_pretrained(name_or_path, ...)`` in float32 (transformers 5 keeps a checkpoint's own dtype by
    default; Lightning's ``precision`` decides the compute dtype) and in train mode (a configuration, ``AutoConfig``,
    as it is). A local directory is read with
    ``local_files_only`` (nothing is asked of the hub); a load that fails is one ``ValueError`` line."""
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        kwargs["local_files_only"] = True
        name_or_path = str(local)
    elif local.is_absolute() or name_or_path.startswith((".", "~")):  # a path, never a hub name
        raise ValueError(f"{what}: model directory {name_or_path!r} does not exist (or is not a directory)")
    elif revision is not None:
        kwargs["revision"] = revision
    try:
        model = auto_class.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError, KeyError) as err:
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(
            f"{what}: cannot load {name_or_path!r}: it is neither a local directory saved with save_pretrained nor a "
            f"Hugging Face hub model that can be loaded ({reason})"
        ) from None
    if not isinstance(model, nn.Module):  # a configuration (``AutoConfig``)
        return model
    # from_pretrained returns the model in eval mode; a module is built in train mode (dropout on while training:
    # Lightning leaves each module's mode as it finds it)
    return model.float().train()


def position_limit(config: Any) -> int | None:
    """The longest input the model's position embeddings cover, or ``None`` when its config does not say."""
    for name in POSITION_LIMITS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_vocabulary(model: nn.Module, vocab_size: int | None, what: str) -> int:
    """Grow the input embedding (and a tied output layer) to ``vocab_size`` rows when the tokenizer has more ids
    than the model (tokens added to a pretrained tokenizer get new, trained rows); a smaller vocabulary leaves the
    embedding as it is (its extra rows are never looked up). Returns the model's embedding rows afterwards."""
    rows = int(model.get_input_embeddings().num_embeddings)  # type: ignore[operator]
    if vocab_size is None:
        return rows
    if vocab_size < 1:
        raise ValueError(f"{what}: vocab_size must be >= 1, got {vocab_size}")
    if vocab_size > rows:
        model.resize_token_embeddings(vocab_size)  # type: ignore[operator]
        rows = vocab_size
    return rows


def check_length(config: Any, length: int | None, argument: str, what: str, name_or_path: str) -> int | None:
    """``length`` checked against the model's position limit: the limit when ``length`` is ``None``."""
    limit = position_limit(config)
    if length is None:
        return limit
    if length < 1:
        raise ValueError(f"{what}: {argument} must be >= 1, got {length}")
    if limit is not None and length > limit:
        raise ValueError(
            f"{what}: {argument}={length} is longer than {name_or_path!r} can take ({limit} positions): set the "
            f"data's {argument} to at most {limit}"
        )
    return length


class HFSequenceClassifier(nn.Module):
    """A pretrained Hugging Face encoder (or decoder) with a sequence-classification head:
    ``AutoModelForSequenceClassification.from_pretrained(name_or_path, num_labels=num_classes)``.

    Called as ``model(input_ids=..., attention_mask=...)`` (the batches of ``TextClassificationDataModule``), it
    returns the logits ``(batch, num_classes)``; pooling and dropout are the model's own (BERT's pooler over
    ``[CLS]``, the last real token for GPT-like models). A pretrained head of another size is replaced by a new
    one (``ignore_mismatched_sizes``), so a checkpoint trained on other labels fine-tunes on this data's classes.
    Use the tokenizer the model was trained with (``tokenizer: <the same name_or_path>`` in the data module).

    Parameter names are the Hugging Face ones under ``model.``: ``freeze: [model.bert.embeddings]``,
    ``lr_multipliers: {model.classifier: 10}``. A checkpoint rebuilds the network from ``name_or_path`` (which must
    still be readable: the directory, or the hub model in the local cache with ``HF_HUB_OFFLINE=1``) and then
    loads its own weights into it.

    Args:
        name_or_path: A local directory written by ``save_pretrained`` (read without any network access) or a hub
            model name such as ``prajjwal1/bert-tiny``, downloaded once into the Hugging Face cache.
        num_classes: Number of output logits: the data's classes, 1 for binary (linked from the data).
        vocab_size: Number of token ids the inputs use: the tokenizer's ``len`` (linked from the data). When it is
            larger than the model's embedding (tokens added to the tokenizer), the embedding grows to it; when it
            is smaller, the embedding is left as it is. Null: the model's own size.
        max_length: Longest input in tokens (linked from the data); an error when the model's position embeddings
            are shorter. Null: the model's limit.
        revision: Hub revision (branch, tag or commit hash) to load; ignored for a local directory.
    """

    #: the weights come trained: the loop doctor expects no fresh network's first loss
    pretrained: bool = True

    def __init__(
        self,
        name_or_path: str,
        num_classes: int,
        vocab_size: int | None = None,
        max_length: int | None = None,
        revision: str | None = None,
    ) -> None:
        super().__init__()
        what = type(self).__name__
        if num_classes < 1:
            raise ValueError(f"{what}: num_classes must be >= 1, got {num_classes}")
        transformers = import_transformers(what)
        self.model = load_pretrained(
            transformers.AutoModelForSequenceClassification,
            name_or_path,
            what,
            revision,
            num_labels=num_classes,
            ignore_mismatched_sizes=True,
        )
        config = self.model.config
        if getattr(config, "pad_token_id", None) is None and isinstance(getattr(config, "eos_token_id", None), int):
            # GPT-like models find each sequence's last token by its padding id; the data modules pad a tokenizer
            # without a padding token with its end-of-text id
            config.pad_token_id = config.eos_token_id
        self.name_or_path = name_or_path
        self.num_classes = num_classes
        self.vocab_size = fit_vocabulary(self.model, vocab_size, what)
        self.max_length = check_length(config, max_length, "max_length", what, name_or_path)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, **inputs: Tensor) -> Tensor:
        """Logits ``(batch, num_classes)`` of token ids ``(batch, seq_len)``; ``attention_mask`` is 1 on tokens and 0
        on padding (None: every position is a token). Other named inputs of the batch (``token_type_ids``) go to
        the model as they are."""
        if input_ids.ndim != 2:
            raise ValueError(
                f"HFSequenceClassifier expects input_ids of shape (batch, seq_len), got {tuple(input_ids.shape)}"
            )
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **inputs).logits


class HFCausalLM(nn.Module):
    """A pretrained Hugging Face causal language model: ``AutoModelForCausalLM.from_pretrained(name_or_path)``, for
    ``LanguageModelModule``.

    Called as ``model(input_ids)`` (the windows of ``CharLMDataModule`` with ``tokenizer: <the same
    name_or_path>``) or with an ``attention_mask``, it returns next-token logits ``(batch, seq_len, vocab_size)``.
    ``block_size`` is the longest context (``LanguageModelModule.generate`` crops prompts to it). Parameter names
    are the Hugging Face ones under ``model.`` (``freeze: [model.transformer.wte]``).

    Args:
        name_or_path: A local directory written by ``save_pretrained`` (read without any network access) or a hub
            model name such as ``sshleifer/tiny-gpt2``, downloaded once into the Hugging Face cache.
        vocab_size: Number of token ids: the tokenizer's ``len`` (linked from the data). A tokenizer larger than
            the model's embedding grows it (and a tied output layer); a smaller one keeps the model's embedding and
            the logits are cut to ``vocab_size`` (the model's extra rows are padding no token maps to). Null: the
            model's own size.
        block_size: Longest context in tokens (linked from the data's ``block_size``); an error when the model's
            position embeddings are shorter. Null: the model's limit.
        revision: Hub revision (branch, tag or commit hash) to load; ignored for a local directory.
    """

    #: the weights come trained: the loop doctor expects no fresh network's first loss
    pretrained: bool = True

    def __init__(
        self,
        name_or_path: str,
        vocab_size: int | None = None,
        block_size: int | None = None,
        revision: str | None = None,
    ) -> None:
        super().__init__()
        what = type(self).__name__
        transformers = import_transformers(what)
        self.model = load_pretrained(transformers.AutoModelForCausalLM, name_or_path, what, revision)
        self.name_or_path = name_or_path
        rows = fit_vocabulary(self.model, vocab_size, what)
        self.vocab_size = rows if vocab_size is None else vocab_size
        self.block_size = check_length(self.model.config, block_size, "block_size", what, name_or_path)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Next-token logits ``(batch, seq_len, vocab_size)`` of token ids ``(batch, seq_len)``. ``attention_mask``
        (1 on tokens, 0 on padding) may be left out for unpadded windows."""
        if input_ids.ndim != 2:
            raise ValueError(f"HFCausalLM expects input_ids of shape (batch, seq_len), got {tuple(input_ids.shape)}")
        if self.block_size is not None and input_ids.shape[1] > self.block_size:
            raise ValueError(
                f"HFCausalLM: sequence length {input_ids.shape[1]} exceeds block_size={self.block_size}: crop the "
                f"context to the last {self.block_size} tokens"
            )
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]


__all__ = ["HFCausalLM", "HFExtraMissing", "HFSequenceClassifier", "import_transformers"]

