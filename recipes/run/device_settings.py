"""The accelerator part of a recipe's config, checked before anything is built: a GPU config on a machine without
CUDA, or bf16 on a GPU without it, is one clear line instead of a slow or failing run."""

from __future__ import annotations

import os

import torch
from jsonargparse import Namespace


class DeviceSettingError(ValueError):
    """The trainer's accelerator or precision cannot run on this machine."""


def apply_device_settings(cfg: Namespace) -> None:
    """Check ``trainer.accelerator`` and ``trainer.precision`` against the machine, apply ``torch_threads`` (torch's
    intra-op thread count) and ``float32_matmul_precision`` on CUDA. Raises ``DeviceSettingError`` with the fix."""
    precision = str(cfg.trainer.get("precision"))
    accelerator = str(cfg.trainer.get("accelerator"))
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise DeviceSettingError(
            f"trainer.accelerator={accelerator!r} (e.g. from configs/trainer/gpu-*.yaml) but torch sees no CUDA "
            "device: leave that -c out, use -c configs/trainer/cpu.yaml, or pass --trainer.accelerator cpu"
        )
    threads = cfg.get("torch_threads")
    if threads is not None:
        if threads < 1:
            raise DeviceSettingError(
                f"torch_threads={threads}: give a number of threads >= 1, or null for torch's default"
            )
        torch.set_num_threads(threads)
        # Lightning's DDP launchers set torch's threads to cores / processes unless OMP_NUM_THREADS is set; the
        # run's own setting wins, in this process and in the ones the launcher starts
        os.environ["OMP_NUM_THREADS"] = str(threads)
    matmul_precision = cfg.get("float32_matmul_precision")
    if matmul_precision and accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        torch.set_float32_matmul_precision(matmul_precision)
    if precision.startswith("bf16") and accelerator in ("gpu", "cuda", "auto") and torch.cuda.is_available():
        if not torch.cuda.is_bf16_supported():
            raise DeviceSettingError(
                f"precision {precision!r} was requested but {torch.cuda.get_device_name()} has no bf16 support: "
                "use -c configs/trainer/gpu-fp16.yaml (16-mixed with a GradScaler) instead"
            )
