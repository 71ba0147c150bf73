"""Tiny decoder-only transformer (GPT) for causal language modelling."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position attends to itself and earlier positions only.

    Args:
        d_model: Width of the input and output; must be divisible by ``n_heads``.
        n_heads: Attention heads.
        dropout: Dropout on the attention weights and on the output projection.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.resid_dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, seq_len, d_model)`` to ``(batch, seq_len, d_model)``."""
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        # (batch, n_heads, seq_len, head_dim)
        q, k, v = (t.reshape(batch, length, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        out = out.transpose(1, 2).reshape(batch, length, width)
        return self.resid_dropout(self.proj(out))


class Block(nn.Module):
    """Pre-LN decoder block: ``x + attn(ln(x))`` then ``x + mlp(ln(x))`` with a 4x GELU MLP.

    Args:
        d_model: Width of the residual stream; must be divisible by ``n_heads``.
        n_heads: Attention heads.
        dropout: Dropout in attention and after each residual branch.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model),
            nn.GELU(),
            nn.Linear(4 * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(batch, seq_len, d_model)`` to ``(batch, seq_len, d_model)``."""
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A tiny GPT: decoder-only transformer that predicts the next token at every position.

    Token embedding plus learned positional embedding, ``n_layers`` pre-LN blocks (causal self-attention with
    ``scaled_dot_product_attention``, 4x GELU MLP), a final LayerNorm and a Linear LM head whose weight is the
    token embedding when ``tie_weights``. GPT-2 initialisation: weights normal(0, 0.02), biases zero, and the
    projections that write into the residual stream scaled down by ``1 / sqrt(2 * n_layers)``.

    Args:
        vocab_size: Number of token ids (the tokenizer's vocabulary size).
        block_size: Longest context in tokens (size of the positional embedding).
        d_model: Width of the embeddings and the residual stream; must be divisible by ``n_heads``.
        n_heads: Attention heads per block.
        n_layers: Number of decoder blocks.
        dropout: Dropout on embeddings, attention weights and residual branches (0 disables it).
        tie_weights: Share one matrix between the token embedding and the LM head.
    """

    def __init__(
        self,
        vocab_size: int,
        block_size: int = 128,
        d_model: int = 128,
        n_heads: int = 4,
        n_layers: int = 2,
        dropout: float = 0.1,
        tie_weights: bool = True,
    ) -> None:
        super().__init__()
        if vocab_size < 1:
            raise ValueError(f"GPT: vocab_size must be >= 1, got {vocab_size}")
        if block_size < 1:
            raise ValueError(f"GPT: block_size must be >= 1, got {block_size}")
        if d_model < 1 or n_heads < 1:
            raise ValueError(f"GPT: d_model and n_heads must be >= 1, got {d_model}, {n_heads}")
        if d_model % n_heads != 0:
            raise ValueError(f"GPT: d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_layers < 1:
            raise ValueError(f"GPT: n_layers must be >= 1, got {n_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GPT: dropout must be in [0, 1), got {dropout}")
        self.vocab_size = vocab_size
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.emb_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok_emb.weight
        self.reset_parameters(n_layers)

    def reset_parameters(self, n_layers: int) -> None:
        """GPT-2 init: normal(0, 0.02) weights, zero biases, residual projections std ``0.02 / sqrt(2 n_layers)``."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
        residual_std = 0.02 / math.sqrt(2 * n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=residual_std)
            nn.init.normal_(block.mlp[2].weight, mean=0.0, std=residual_std)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Map token ids ``(batch, seq_len)`` to next-token logits ``(batch, seq_len, vocab_size)``.

        Position ``t`` sees tokens ``0..t`` only. ``attention_mask`` is accepted so that dict batches from the
        tokenizing data modules can be passed as keyword arguments, and is not used: with right padding the
        causal mask already keeps every real token from seeing the padding after it. Logits at padded positions
        are meaningless; leave them out of the loss (e.g. labels of -100). Left-padded batches are not supported.
        """
        if input_ids.ndim != 2:
            raise ValueError(f"GPT expects input_ids of shape (batch, seq_len), got {tuple(input_ids.shape)}")
        length = input_ids.shape[1]
        if length > self.block_size:
            raise ValueError(
                f"GPT: sequence length {length} exceeds block_size={self.block_size}: crop the context to the last "
                f"{self.block_size} tokens or raise block_size"
            )
        positions = torch.arange(length, device=input_ids.device)
        x = self.emb_dropout(self.tok_emb(input_ids) + self.pos_emb(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
