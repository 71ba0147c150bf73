"""The values a task logs are those of a per-step ``self.log`` and a per-batch metric update (issue 17, item 2).

A task hands ``train/loss`` to Lightning only on logging steps, the epoch's last batch and the run's last step, and
applies its metric updates a few batches at a time (``DeferredMetricUpdates``). Each test trains the same model twice
from the same seed, once as loopwise does and once with every step read (what a task did before: log and update on
every batch), and compares everything the loggers and callbacks receive: the same steps and names, the losses and
counting metrics (accuracy, F1, AUROC) exactly, the metrics that sum floats (errors, R², perplexity) to float32
rounding (one sum over concatenated batches adds in another order than one sum per batch).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_modules import ClassificationModule, LanguageModelModule, RegressionModule
from lightning_modules.metrics.deferred_metric_updates import DeferredMetricUpdates
from lightning_modules.models import MLP

pytestmark = pytest.mark.usefixtures("one_thread")


class Recorder(Logger):
    """Every ``log_metrics`` call, and the callback metrics at each epoch end."""

    name, version = "recorder", "0"

    def __init__(self) -> None:
        super().__init__()
        self.logged: list[tuple[int | None, dict[str, float]]] = []

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.logged.append((step, {k: float(v) for k, v in metrics.items()}))


class EpochLines(L.Callback):
    """What ``recipes.callbacks.epoch_summary.EpochSummary`` prints: the callback metrics at each epoch end."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, float]] = []

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epochs.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def every_step(task_class: type) -> type:
    """The task reading every step and batch: a per-step log and a per-batch metric update, as before."""

    class EveryStep(task_class):
        def _train_values_read_now(self) -> bool:
            return True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for updates in self.metric_updates.values():
                updates.max_elements = 0  # every batch's update applied at once

        def _last_evaluation_batch(self, batch_idx: int | None) -> bool:
            return True

    return EveryStep


def fit_and_record(build: Any, train: DataLoader, val: DataLoader, **kwargs: Any) -> tuple[list, list]:
    L.seed_everything(0)
    recorder, lines = Recorder(), EpochLines()
    trainer = L.Trainer(
        max_epochs=2, log_every_n_steps=3, logger=recorder, callbacks=[lines], enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", deterministic=True, **kwargs,
    )
    trainer.fit(build(), train, val)
    return recorder.logged, lines.epochs


def same_records(build_deferred: Any, build_every_step: Any, train: DataLoader, val: DataLoader, **kwargs: Any) -> None:
    deferred = fit_and_record(build_deferred, train, val, **kwargs)
    reference = fit_and_record(build_every_step, train, val, **kwargs)
    (logged, epochs), (logged_before, epochs_before) = deferred, reference
    assert [(step, sorted(m)) for step, m in logged] == [(step, sorted(m)) for step, m in logged_before]
    for (_, metrics), (_, before) in zip(logged + [(None, e) for e in epochs],
                                         logged_before + [(None, e) for e in epochs_before]):
        for name, value in metrics.items():
            exact = name.endswith(("loss", "acc", "f1", "auroc", "epoch"))
            assert value == (before[name] if exact else pytest.approx(before[name], rel=1e-5, abs=1e-6)), name
    assert sum("train/loss" in metrics for _, metrics in logged) >= 3  # logged at steps 2, 5, 8, ...
    assert all("train/loss" in line for line in epochs)


def rows(n: int, seed: int, features: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, features, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def test_classification_logs_the_same_loss_metrics_and_epoch_lines():
    x, y = rows(100, 0)  # 7 batches of 16 (the last one 4): logging steps 2 and 5, then the last batch 6
    xv, yv = rows(40, 1)
    train = DataLoader(TensorDataset(x, y), batch_size=16)
    val = DataLoader(TensorDataset(xv, yv), batch_size=16)

    def build(task_class: type) -> Any:
        return lambda: task_class(MLP(2, 3, [16]), 3)

    same_records(build(ClassificationModule), build(every_step(ClassificationModule)), train, val,
                 gradient_clip_val=1.0)


def test_regression_logs_the_same_values_with_two_targets():
    x, _ = rows(90, 2, features=3)
    y = torch.stack([x.sum(dim=1), x[:, 0] - x[:, 1]], dim=1)
    train = DataLoader(TensorDataset(x, y), batch_size=16)
    val = DataLoader(TensorDataset(x[:30], y[:30]), batch_size=8)

    def build(task_class: type) -> Any:
        return lambda: task_class(MLP(3, 2, [8]), out_features=2)

    same_records(build(RegressionModule), build(every_step(RegressionModule)), train, val)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 11) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 8)
        self.head = nn.Linear(8, vocab)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.embed(input_ids))


class LengthBuckets(torch.utils.data.Dataset):
    """Sequences of 3 lengths: consecutive batches differ in shape beyond the batch dimension."""

    def __init__(self, n: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.items = [torch.randint(0, 11, (5 + 3 * (i // 8 % 3),), generator=generator) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.items[i][:-1], self.items[i][1:]


def test_language_model_logs_the_same_perplexity_over_batches_of_different_lengths():
    train = DataLoader(LengthBuckets(96, 0), batch_size=8)  # lengths 4, 7, 10, 4, ... per batch
    val = DataLoader(LengthBuckets(24, 1), batch_size=8)

    def build(task_class: type) -> Any:
        return lambda: task_class(TinyLM(), vocab_size=11)

    same_records(build(LanguageModelModule), build(every_step(LanguageModelModule)), train, val)


def test_deferred_updates_concatenate_runs_of_equal_shape_and_flush_when_large():
    calls: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    updates = DeferredMetricUpdates(lambda o, t: calls.append((tuple(o.shape), tuple(t.shape))), max_elements=1000)
    for length in (4, 4, 7, 4):
        updates.add(torch.zeros(2, length, 3), torch.zeros(2, length))
    assert calls == [] and len(updates) == 4
    updates.flush()
    assert calls == [((4, 4, 3), (4, 4)), ((2, 7, 3), (2, 7)), ((2, 4, 3), (2, 4))] and len(updates) == 0
    updates.add(torch.zeros(40, 30), torch.zeros(40))  # 1,240 elements > 1,000: applied at once
    assert calls[-1] == ((40, 30), (40,)) and len(updates) == 0


def test_the_training_metrics_are_updated_once_an_epoch_not_at_each_logging_step():
    # issue 32: they are epoch values; each update costs a fixed ~0.3-0.5 ms of torchmetrics' Python on a CPU, so
    # applying the kept batches at every logging step cost a small network ~5% of its steps
    x, y = rows(100, 0)  # 7 batches of 16: logging steps 2 and 5, then the last batch 6
    task = ClassificationModule(MLP(2, 3, [16]), 3)
    sizes: list[int] = []
    update = task.metric_updates["train"].update
    task.metric_updates["train"].update = lambda o, t: sizes.append(len(o)) or update(o, t)
    recorder = Recorder()
    trainer = L.Trainer(max_epochs=2, log_every_n_steps=3, logger=recorder, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", limit_val_batches=0)
    trainer.fit(task, DataLoader(TensorDataset(x, y), batch_size=16))
    assert sizes == [100, 100]  # the whole epoch's rows, once per epoch
    assert [s for s, m in recorder.logged if "train/loss" in m] == [2, 5, 8, 11]  # the loss at every logging step
    assert sum("train/acc" in m for _, m in recorder.logged) == 2
