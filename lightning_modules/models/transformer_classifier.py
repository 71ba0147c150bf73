"""Transformer encoder for sequence classification."""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

POOLINGS = ("mean", "cls")


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    """The fixed sine/cosine position table of "Attention Is All You Need", shape ``(length, d_model)``."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * div)
    table[:, 1::2] = torch.cos(position * div)[:, : d_model // 2]
    return table


class TransformerClassifier(nn.Module):
    """Pre-LN transformer encoder that classifies token sequences.

    Token embedding (the ``pad_id`` row is zero and gets no gradient) plus fixed sinusoidal positional
    encoding (no parameters, so no length learnt from the training data), a stack of ``nn.TransformerEncoder``
    layers (``batch_first``, ``norm_first``, padding masked out of attention), pooling into one vector per
    sequence, a final LayerNorm and a Linear head. ``mean`` pooling averages the real tokens only, so a
    sequence gets the same logits alone or right-padded inside a batch. ``cls`` pooling prepends a learned CLS
    token (which takes no positional encoding and does not count towards ``max_length``) and reads its output.

    Args:
        vocab_size: Number of token ids (the tokenizer's vocabulary size, padding included).
        num_classes: Number of output logits: number of classes, 1 for binary.
        d_model: Width of the embeddings and of every layer; must be divisible by ``n_heads``.
        n_heads: Attention heads per layer.
        n_layers: Number of encoder layers.
        dim_feedforward: Hidden width of each feed-forward block (default ``4 * d_model``).
        dropout: Dropout probability in attention, feed-forward blocks and after the embeddings (0 disables it).
        max_length: Longest sequence (in tokens, CLS excluded) the model accepts.
        pooling: How the sequence becomes one vector: "mean" over real tokens, or "cls" (learned CLS token).
        pad_id: Token id of padding; its embedding row is kept at zero. Which tokens are padding is told by
            ``attention_mask``, not by this id.
    """

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        dim_feedforward: int | None = None,
        dropout: float = 0.1,
        max_length: int = 512,
        pooling: Literal["mean", "cls"] = "mean",
        pad_id: int = 0,
    ) -> None:
        super().__init__()
        if vocab_size < 1:
            raise ValueError(f"TransformerClassifier: vocab_size must be >= 1, got {vocab_size}")
        if num_classes < 1:
            raise ValueError(f"TransformerClassifier: num_classes must be >= 1, got {num_classes}")
        if d_model < 1 or n_heads < 1:
            raise ValueError(f"TransformerClassifier: d_model and n_heads must be >= 1, got {d_model}, {n_heads}")
        if d_model % n_heads != 0:
            raise ValueError(f"TransformerClassifier: d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_layers < 1:
            raise ValueError(f"TransformerClassifier: n_layers must be >= 1, got {n_layers}")
        if dim_feedforward is not None and dim_feedforward < 1:
            raise ValueError(f"TransformerClassifier: dim_feedforward must be >= 1 or null, got {dim_feedforward}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"TransformerClassifier: dropout must be in [0, 1), got {dropout}")
        if max_length < 1:
            raise ValueError(f"TransformerClassifier: max_length must be >= 1, got {max_length}")
        if pooling not in POOLINGS:
            raise ValueError(f"TransformerClassifier: unknown pooling {pooling!r}; choose one of {list(POOLINGS)}")
        if not 0 <= pad_id < vocab_size:
            raise ValueError(f"TransformerClassifier: pad_id must be in [0, vocab_size={vocab_size}), got {pad_id}")
        self.vocab_size = vocab_size
        self.num_classes = num_classes
        self.max_length = max_length
        self.pooling = pooling
        self.pad_id = pad_id
        self.tok_emb = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.register_buffer("positions", sinusoidal_positions(max_length, d_model), persistent=False)
        self.emb_dropout = nn.Dropout(dropout)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d_model)) if pooling == "cls" else None
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=0.02)
        layer = nn.TransformerEncoderLayer(
            d_model,
            n_heads,
            dim_feedforward=dim_feedforward if dim_feedforward is not None else 4 * d_model,
            dropout=dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # No nested tensors: the fast path would zero (not compute) padded positions in eval mode only, making
        # train and eval disagree; with it off, padded positions are masked out of attention in both modes.
        self.encoder = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Map token ids ``(batch, seq_len)`` to logits ``(batch, num_classes)``.

        ``attention_mask`` (``(batch, seq_len)``, long or bool) is 1/True for real tokens and 0/False for
        padding; None means every token is real. A sequence with no real token gets finite logits from a zero
        pooled vector (mean pooling) or from the CLS token alone (cls pooling).
        """
        if input_ids.ndim != 2:
            raise ValueError(
                f"TransformerClassifier expects input_ids of shape (batch, seq_len), got {tuple(input_ids.shape)}"
            )
        batch, length = input_ids.shape
        if length > self.max_length:
            raise ValueError(
                f"TransformerClassifier: sequence length {length} exceeds max_length={self.max_length}: truncate "
                "the inputs or raise max_length"
            )
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"TransformerClassifier: attention_mask shape {tuple(attention_mask.shape)} does not match "
                f"input_ids shape {tuple(input_ids.shape)}"
            )
        x = self.tok_emb(input_ids) + self.positions[:length]
        real = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask != 0
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(batch, -1, -1).to(x.dtype), x], dim=1)
            real = torch.cat([real.new_ones(batch, 1), real], dim=1)
        x = self.emb_dropout(x)
        # True = ignore. A row with no real token would attend to nothing (NaN): let it attend to everything;
        # its padding is still left out of the mean below.
        ignore = ~real
        ignore = ignore & ~ignore.all(dim=1, keepdim=True)
        x = self.encoder(x, src_key_padding_mask=ignore)
        if self.cls_token is not None:
            pooled = x[:, 0]
        else:
            weights = real.unsqueeze(-1).to(x.dtype)
            pooled = (x * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(self.norm(pooled))
