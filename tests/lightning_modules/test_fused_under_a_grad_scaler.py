"""Under ``16-mixed`` with gradient clipping the task keeps the optimizer unfused: Lightning unscales a GradScaler's
gradients before it clips, which an optimizer that unscales inside its own step (``fused=True``, what the task builds
on CUDA and the CPU) does not allow. Measured on an H200: every recipe with ``gradient_clip_val`` under
``configs/trainer/gpu-fp16.yaml`` stopped at its first step ("AdamW does not allow for gradient clipping")."""

from __future__ import annotations

import functools

import lightning as L
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision

import lightning_modules.task as task_module
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP


@pytest.mark.parametrize("clip, fused_asked", [(1.0, False), (0.0, True)])
def test_the_task_asks_for_a_fused_optimizer_only_when_no_grad_scaler_clips(tmp_path, monkeypatch, clip, fused_asked):
    asked: list[torch.optim.Optimizer] = []

    def recording(optimizer, device_type=None):
        asked.append(optimizer)
        return optimizer

    monkeypatch.setattr(task_module, "fused_where_supported", recording)
    L.seed_everything(0)
    x, y = torch.randn(32, 2), torch.randint(0, 3, (32,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    module = ClassificationModule(MLP(2, 3, [8]), 3, optimizer=functools.partial(torch.optim.AdamW, lr=0.01))
    scaler = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    trainer = L.Trainer(max_epochs=1, plugins=[scaler], gradient_clip_val=clip, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(module, loader)
    assert trainer.global_step == 2
    assert bool(asked) is fused_asked
