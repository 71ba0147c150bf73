"""Hugging Face tokenizers for the text data modules (the optional extra ``loopwise[hf]``).

``tokenizer: <local directory or hub name>`` in ``TextClassificationDataModule`` or ``CharLMDataModule`` loads the
tokenizer with ``AutoTokenizer.from_pretrained``; ``transformers`` is imported then, never when ``datamodules`` is
imported. Ids, special tokens, the padding id and side and the longest input are the tokenizer's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from datamodules.tokenizers import TOKENIZERS

HF_EXTRA = 'pip install "loopwise[hf]"'
# transformers' model_max_length when a tokenizer does not know its model's limit (int(1e30))
NO_LIMIT = 10**12


def looks_like_a_path(name: str) -> bool:
    """Whether ``name`` can only be a filesystem path (absolute, or starting with ``.`` or ``~``), not a hub name."""
    return Path(name).is_absolute() or name.startswith((".", "~"))


def is_builtin_tokenizer(name: str) -> bool:
    """Whether ``name`` is one of loopwise's own tokenizers ("char", "word") rather than a Hugging Face one."""
    return name in TOKENIZERS


class HFTokenizer:
    """A Hugging Face tokenizer as the text data modules use it.

    Loaded with ``AutoTokenizer.from_pretrained(name_or_path)``: from a local directory (written by
    ``save_pretrained``) without any network access, or by hub name (downloaded once into the Hugging Face cache;
    with ``HF_HUB_OFFLINE=1`` only the cache is read). Anything that cannot be loaded is one ``ValueError`` line.

    ``pad_id`` is the tokenizer's padding token, or its end-of-text token when it has none (GPT-2), or 0 (padding is
    masked out by the attention mask, so its id only has to be a valid one); ``padding_side`` is the tokenizer's;
    ``max_length`` its ``model_max_length`` (``None`` when it does not know); ``vocab_size`` is ``len(tokenizer)``
    (added tokens included).

    Args:
        name_or_path: A local directory or a hub name, e.g. ``prajjwal1/bert-tiny``.
        owner: Name that starts error messages (the data module's).
    """

    def __init__(self, name_or_path: str, owner: str = "tokenizer") -> None:
        try:
            import transformers
        except ImportError:
            raise ValueError(
                f"{owner}: unknown tokenizer {name_or_path!r}: not one of {sorted(TOKENIZERS)}, and a Hugging Face "
                f"tokenizer (a local directory or hub name) needs transformers, which is not installed: {HF_EXTRA}"
            ) from None
        kwargs: dict[str, Any] = {}
        local = Path(name_or_path).expanduser()
        if local.is_dir():
            kwargs["local_files_only"] = True
        elif looks_like_a_path(name_or_path):
            raise ValueError(f"{owner}: tokenizer directory {name_or_path!r} does not exist (or is not a directory)")
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                str(local) if local.is_dir() else name_or_path, **kwargs
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ValueError(
                f"{owner}: unknown tokenizer {name_or_path!r}: not one of {sorted(TOKENIZERS)}, nor a local directory "
                f"with a Hugging Face tokenizer, nor a hub tokenizer that can be loaded ({reason})"
            ) from None
        self.name = name_or_path
        self.tokenizer = tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id: int = int(pad) if pad is not None else 0
        self.padding_side: str = str(getattr(tokenizer, "padding_side", "right"))
        limit = getattr(tokenizer, "model_max_length", None)
        self.max_length: int | None = int(limit) if isinstance(limit, int) and 0 < limit < NO_LIMIT else None
        self.vocab_size: int = len(tokenizer)

    @property
    def unk_id(self) -> int | None:
        """Id of the unknown token, or ``None`` (byte-level tokenizers encode every text)."""
        return self.tokenizer.unk_token_id

    @property
    def special_tokens(self) -> list[str]:
        """The tokenizer's special tokens (``[CLS]``, ``[SEP]``, ``[PAD]``, ``<|endoftext|>``, ...)."""
        return list(self.tokenizer.all_special_tokens)

    def tokenize(self, text: str) -> list[str]:
        """The tokens of ``text`` as strings, without special tokens."""
        return list(self.tokenizer.tokenize(text))

    def encode(self, text: str, max_length: int | None = None, special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``: with the tokenizer's special tokens (``[CLS] ... [SEP]``, a BOS) when
        ``special_tokens``, truncated to ``max_length`` ids (special tokens kept) when given."""
        encoded = self.tokenizer(
            text,
            add_special_tokens=special_tokens,
            truncation=max_length is not None,
            max_length=max_length,
            verbose=False,
        )
        return list(encoded["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (special tokens written out)."""
        return str(self.tokenizer.decode([int(i) for i in ids]))

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records: the tokenizer's name and size (plain values)."""
        return {"tokenizer": self.name, "tokenizer_size": self.vocab_size}

    def check_state(self, state: dict[str, Any], owner: str) -> None:
        """Refuse a checkpoint's data state made when this tokenizer had another size (its directory was rewritten,
        tokens were added): the ids would not mean what the model learnt. The name is the data module's to check."""
        size = state.get("tokenizer_size")
        if size is not None and size != self.vocab_size:
            raise ValueError(
                f"{owner}: tokenizer {self.name!r} has {self.vocab_size} tokens now, but the checkpoint was trained "
                f"when it had {size}; use the tokenizer the model was trained with"
            )

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab_size={self.vocab_size}, pad_id={self.pad_id})"


__all__ = ["HFTokenizer", "is_builtin_tokenizer"]
