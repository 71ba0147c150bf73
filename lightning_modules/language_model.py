"""Causal language modelling on token ids: next-token cross entropy, perplexity, sampling."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics import MetricCollection
from torchmetrics.text import Perplexity

from lightning_modules.batches import batch_length, split_batch
from lightning_modules.data_checks import check_data_size, check_output_shape
from lightning_modules.kept_signature import kept_signature
from lightning_modules.task import StepOutput, Task, initial_loss_wording


class LanguageModelModule(Task):
    """Train a network that maps token ids ``(batch, time)`` to next-token logits ``(batch, time, vocab)``.

    Batches are ``(input_ids, targets)`` with targets shifted by one (as ``CharLMDataModule`` yields them) or
    dicts with ``input_ids`` and token-level ``labels`` (padding labelled ``ignore_index``). The loss is the mean
    cross entropy over non-ignored positions; ``val/ppl`` is its exponential.

    ``predict`` on a batch of prompts (``{"prompt_ids": [LongTensor, ...], "index": ...}``, as
    ``CharLMDataModule(prompt_path=...)`` gives them) generates ``max_new_tokens`` tokens after each prompt with
    ``generate``; on ``(input_ids, targets)`` batches it gives the most likely next token at every position. The
    generation options are not saved in checkpoints: ``recipes predict --model.init_args.max_new_tokens 100``
    applies to any checkpoint.

    The other arguments (``optimizer``, ``schedule``, ``monitor``, ``monitor_mode``, ``compile``, ``channels_last``)
    are ``Task``'s, passed on through ``**kwargs``; ``monitor`` defaults to ``val/loss``.

    Args:
        model: The network (e.g. ``GPT``); called as ``model(input_ids)`` or with the batch's named inputs.
        vocab_size: Size of the vocabulary (the network's output width).
        ignore_index: Target value that contributes nothing to loss and perplexity (padding).
        max_new_tokens: ``predict`` with prompts: tokens (characters) generated after each prompt.
        temperature: ``predict`` with prompts: divides the logits before sampling (lower: more conservative);
            0 is greedy.
        top_k: ``predict`` with prompts: sample among the ``top_k`` most likely tokens only; 1 is greedy
            (deterministic); null samples from the whole vocabulary.
        sample_seed: ``predict`` with prompts: seed of the sampling; prompt ``i`` of the file draws from its own
            generator seeded from ``sample_seed`` and ``i``, so the output repeats for the same prompts and seed
            whatever the batch size.
    """

    default_monitor = "val/loss"
    prediction_options = ("max_new_tokens", "temperature", "top_k", "sample_seed")

    def __init__(
        self,
        model: nn.Module,
        vocab_size: int,
        ignore_index: int = -100,
        max_new_tokens: int = 200,
        temperature: float = 1.0,
        top_k: int | None = None,
        sample_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        if vocab_size < 2:
            raise ValueError(f"LanguageModelModule: vocab_size must be >= 2, got {vocab_size}")
        if max_new_tokens < 1:
            raise ValueError(f"LanguageModelModule: max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"LanguageModelModule: temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"LanguageModelModule: top_k must be >= 1 or null, got {top_k}")
        self.vocab_size = vocab_size
        self.ignore_index = ignore_index
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_k = top_k
        self.sample_seed = sample_seed
        super().__init__(model, **kwargs)

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"ppl": Perplexity(ignore_index=self.ignore_index)})

    def expected_initial_loss(self) -> float | None:
        """ln(vocab_size): the next-token cross entropy of a uniform guess over the vocabulary; ``None`` for a
        network that starts from trained weights (``init_from``, or a pretrained Hugging Face model)."""
        if self.fine_tuning.starts_pretrained:
            return None
        tokens = int(self.vocab_size)
        return math.log(tokens) if tokens >= 2 else None

    def explain_expected_initial_loss(self, expected: float) -> str:
        return initial_loss_wording(expected, int(self.vocab_size), "vocabulary size")

    def check_data(self, datamodule: Any) -> None:
        check_data_size(self, datamodule, "vocab_size", "vocab_size={}", network="the network's")

    def logits(self, inputs: Any) -> Tensor:
        """Next-token logits ``(batch, time, vocab_size)``, checked against the vocabulary size."""
        logits = self.run_model(inputs)
        check_output_shape(
            logits, ("batch", "time", self.vocab_size), f"LanguageModelModule(vocab_size={self.vocab_size})"
        )
        return logits

    def forward_batch(self, batch: Any) -> StepOutput:
        inputs, targets = split_batch(batch)
        if targets is None:
            raise ValueError("LanguageModelModule: training and evaluation batches need next-token targets")
        logits = self.logits(inputs)
        if targets.shape != logits.shape[:2]:
            raise ValueError(
                f"LanguageModelModule: targets of shape {tuple(targets.shape)} do not match the logits' "
                f"(batch, time) {tuple(logits.shape[:2])}"
            )
        # flat (batch * time, vocab): the same mean over the tokens, and CUDA's 2-d NLL kernel (atomic adds) would
        # refuse deterministic: true
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=self.ignore_index)
        tokens = (targets != self.ignore_index).sum()  # what the loss is a mean over: the val/test loss weighs by it
        return StepOutput(loss, logits.detach(), targets, batch_length(inputs), tokens)

    @kept_signature
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        """Prompts: the ``max_new_tokens`` generated token ids after each prompt ``(batch, max_new_tokens)``.
        Windows: the most likely next token at every position ``(batch, time)``."""
        if isinstance(batch, Mapping) and "prompt_ids" in batch:
            return self.continue_prompts(batch["prompt_ids"], batch.get("index"))
        inputs, _ = split_batch(batch)
        return self.logits(inputs).argmax(dim=-1)

    def continue_prompts(self, prompts: list[Tensor], index: Tensor | None = None) -> Tensor:
        """``generate`` with this module's options after each prompt (1-D token ids): the new ids only,
        ``(len(prompts), max_new_tokens)``. ``index`` (the prompts' numbers in their file) seeds each prompt's
        sampling generator from ``sample_seed``; default: their positions in ``prompts``."""
        numbers = index.tolist() if index is not None else list(range(len(prompts)))
        out = []
        for prompt, number in zip(prompts, numbers):
            generator = torch.Generator().manual_seed(self.sample_seed * 1_000_003 + int(number))
            ids = self.generate(prompt, self.max_new_tokens, self.temperature, self.top_k, generator=generator)
            out.append(ids[len(prompt) :])
        return torch.stack(out)

    def prediction_columns(self, outputs: Tensor, datamodule: Any = None) -> dict[str, list[Any]] | None:
        """Generated continuations: ``prompt`` (the data module's ``prompts``) and ``continuation`` (the new ids
        decoded with its ``decode``). ``None`` for next-token predictions on windows (written as raw ids)."""
        prompts = list(getattr(datamodule, "prompts", None) or [])
        decode = getattr(datamodule, "decode", None)
        if not prompts or len(prompts) != len(outputs) or not callable(decode):
            return None
        return {"prompt": prompts, "continuation": [decode(row.long().tolist()) for row in outputs]}

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Tensor:
        """Sample ``max_new_tokens`` tokens after ``prompt_ids`` (``(time,)`` or ``(batch, time)``).

        The context is cropped to the network's ``block_size`` when it has one. ``top_k=1`` (or
        ``temperature=0``) is greedy decoding and deterministic. Returns prompt and new tokens together, with the
        prompt's shape convention. The module is put in eval mode for sampling and restored afterwards.
        """
        if max_new_tokens < 0:
            raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"generate: temperature must be >= 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"generate: top_k must be >= 1, got {top_k}")
        squeeze = prompt_ids.ndim == 1
        ids = prompt_ids.unsqueeze(0) if squeeze else prompt_ids
        if ids.shape[1] == 0:
            raise ValueError("generate: the prompt must hold at least one token")
        ids = ids.to(self.device)
        block_size = getattr(self.model, "block_size", None)
        was_training = self.training
        self.eval()
        try:
            for _ in range(max_new_tokens):
                context = ids if block_size is None else ids[:, -block_size:]
                logits = self.run_model(context)[:, -1, :].float()
                if temperature == 0 or top_k == 1:
                    next_id = logits.argmax(dim=-1, keepdim=True)
                else:
                    logits = logits / temperature
                    if top_k is not None:
                        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
                        logits = logits.masked_fill(logits < kth, float("-inf"))
                    probs = logits.softmax(dim=-1)
                    next_id = torch.multinomial(probs.cpu(), 1, generator=generator).to(ids.device)
                ids = torch.cat([ids, next_id], dim=1)
        finally:
            self.train(was_training)
        return ids.squeeze(0) if squeeze else ids
