"""Tokenizers and a vocabulary built from the train split only, small enough to live in a checkpoint."""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Iterable, Sequence

PAD = "<pad>"
UNK = "<unk>"



def char_tokenize(text: str) -> list[str]:
    """Every character of ``text`` is a token: case, spaces, punctuation and newlines are all kept."""
    return list(text)


def word_tokenize(text: str) -> list[str]:
    """``text.lower().split()``: lower-cased, split on runs of (Unicode) whitespace.

    Punctuation is not split off: ``"Great, fun!"`` gives ``["great,", "fun!"]``.
    """
    return text.lower().split()


TOKENIZERS: dict[str, Callable[[str], list[str]]] = {"char": char_tokenize, "word": word_tokenize}


def get_tokenizer(name: str) -> Callable[[str], list[str]]:
    """The tokenizer called ``name`` ("char" or "word"), with a clear error for any other name."""
    try:
        return TOKENIZERS[name]
    except KeyError:
        raise ValueError(f"unknown tokenizer {name!r}; choose one of {sorted(TOKENIZERS)}") from None


class Vocabulary:
    """A token <-> id mapping; ids are positions in ``itos``.

    The special tokens come first (by default ``<pad>`` = 0 and ``<unk>`` = 1), then the regular tokens. Tokens
    never seen when the vocabulary was built encode to the ``<unk>`` id. A token equal to a special token's text
    encodes to that special token's id.

    Args:
        itos: Every token, in id order (specials included).
        unk_token: The token that unknown tokens map to; must be in ``itos``.
    """

    def __init__(self, itos: Sequence[str], unk_token: str = UNK) -> None:
        itos = list(itos)
        if len(set(itos)) != len(itos):
            duplicates = sorted({t for t in itos if itos.count(t) > 1})
            raise ValueError(f"Vocabulary: duplicate tokens {duplicates[:10]}")
        if unk_token not in itos:
            raise ValueError(f"Vocabulary: the unknown token {unk_token!r} is not in the vocabulary")
        self.itos = itos
        self.stoi = {token: i for i, token in enumerate(itos)}
        self.unk_token = unk_token
        self.unk_id = self.stoi[unk_token]

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        min_freq: int = 1,
        max_size: int | None = None,
        specials: Sequence[str] = (PAD, UNK),
    ) -> "Vocabulary":
        """Count tokens over ``token_lists`` (the train split) and keep the frequent ones.

        Regular tokens are ordered by descending count, ties alphabetically, so the ids are deterministic.

        Args:
            token_lists: One token list per sample.
            min_freq: Keep tokens seen at least this often.
            max_size: At most this many ids in all, specials included (``None``: no limit); the most frequent
                tokens are kept.
            specials: Special tokens, given ids ``0..len(specials)-1`` in this order; must include ``<unk>``.
        """
        if min_freq < 1:
            raise ValueError(f"Vocabulary.build: min_freq must be >= 1, got {min_freq}")
        if max_size is not None and max_size < len(specials):
            raise ValueError(
                f"Vocabulary.build: max_size={max_size} leaves no room for the {len(specials)} special tokens "
                f"{list(specials)}"
            )
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        special_set = set(specials)
        kept = sorted(
            ((token, n) for token, n in counts.items() if n >= min_freq and token not in special_set),
            key=lambda item: (-item[1], item[0]),
        )
        if max_size is not None:
            kept = kept[: max_size - len(specials)]
        return cls(list(specials) + [token for token, _ in kept])

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, token: object) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self.itos == other.itos and self.unk_token == other.unk_token

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)}, first={self.itos[:8]})"

    @property
    def pad_id(self) -> int | None:
        """Id of ``<pad>``, or ``None`` when the vocabulary has no padding token."""
        return self.stoi.get(PAD)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Token ids; tokens not in the vocabulary become ``unk_id``."""
        stoi, unk = self.stoi, self.unk_id
        return [stoi.get(token, unk) for token in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Tokens of ``ids`` (specials appear as their text, e.g. ``<unk>``)."""
        itos = self.itos
        return [itos[int(i)] for i in ids]

    def state_dict(self) -> dict[str, Any]:
        """Plain lists and strings, safe for a checkpoint (``weights_only`` loading included)."""
        return {"itos": list(self.itos), "unk_token": self.unk_token}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> "Vocabulary":
        """Rebuild a vocabulary saved with ``state_dict``."""
        return cls(state["itos"], unk_token=state.get("unk_token", UNK))
