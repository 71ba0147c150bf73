"""The task's optimizer runs torch's fused kernel on the CPU too, and a resume keeps the kernel this machine chose, not
the checkpoint's: a checkpoint of an unfused run (every CPU run before fused CPU kernels were chosen) resumes fused,
with the same update as an unfused resume, and a fused run's checkpoint resumed under ``16-mixed`` with clipping (where
the task keeps the optimizer unfused) runs unfused. Both kernel assertions fail without ``keep_kernel_on_load``."""

from __future__ import annotations

import functools
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

import lightning_modules.task as task_module
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP


def _loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 2, generator=generator), torch.randint(0, 3, (64,), generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def _fit(root: Path, epochs: int, ckpt_path: str | None = None, fused: bool | None = None,
         **trainer_args) -> tuple[L.Trainer, ClassificationModule]:
    L.seed_everything(0)
    optimizer = functools.partial(torch.optim.AdamW, lr=0.01, **({} if fused is None else {"fused": fused}))
    module = ClassificationModule(MLP(2, 3, [8]), 3, optimizer=optimizer)
    trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, **trainer_args)
    trainer.fit(module, _loader(), ckpt_path=ckpt_path)
    return trainer, module


def _kernels(optimizer: torch.optim.Optimizer) -> list[object]:
    return [group["fused"] for group in optimizer.param_groups]


@pytest.fixture
def unfused_checkpoint(tmp_path, monkeypatch) -> Path:
    """A checkpoint as the task wrote it before it chose fused kernels on the CPU."""
    with monkeypatch.context() as patch:
        patch.setattr(task_module, "fused_where_supported", lambda optimizer: optimizer)
        trainer, _ = _fit(tmp_path, epochs=1)
    path = tmp_path / "unfused.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)["optimizer_states"][0]
    assert {group["fused"] for group in saved["param_groups"]} == {None}
    return path


def test_the_task_fuses_the_optimizer_on_the_cpu_unless_the_config_chose(tmp_path):
    trainer, _ = _fit(tmp_path, epochs=1)
    assert _kernels(trainer.optimizers[0]) == [True, True]  # decay and no_decay groups
    trainer, _ = _fit(tmp_path, epochs=1, fused=False)
    assert _kernels(trainer.optimizers[0]) == [False, False]


def test_an_unfused_checkpoint_resumes_fused_with_the_same_update(tmp_path, monkeypatch, unfused_checkpoint):
    trainer, fused = _fit(tmp_path, epochs=3, ckpt_path=str(unfused_checkpoint))
    assert trainer.global_step == 12 and _kernels(trainer.optimizers[0]) == [True, True]
    with monkeypatch.context() as patch:
        patch.setattr(task_module, "fused_where_supported", lambda optimizer: optimizer)
        trainer, unfused = _fit(tmp_path, epochs=3, ckpt_path=str(unfused_checkpoint))
    assert _kernels(trainer.optimizers[0]) == [None, None]
    moved = [(a - b).abs().max().item() for a, b in zip(fused.parameters(), unfused.parameters())]
    assert max(moved) < 1e-5  # Adam's moments and step count came from the checkpoint in both


def test_a_fused_checkpoint_resumes_under_16_mixed_clipping(tmp_path):
    trainer, _ = _fit(tmp_path, epochs=1)
    path = tmp_path / "fused.ckpt"
    trainer.save_checkpoint(path)
    scaler = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    trainer, module = _fit(tmp_path, epochs=2, ckpt_path=str(path), plugins=[scaler], gradient_clip_val=1.0)
    assert trainer.global_step == 8 and _kernels(trainer.optimizers[0]) == [None, None]
    assert all(torch.isfinite(p).all() for p in module.parameters())
