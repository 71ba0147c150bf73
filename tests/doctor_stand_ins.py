"""Stand-ins the loop doctor's tests inject: random rows, a data set that sleeps in every ``__getitem__`` and a network
that switches itself to train mode (shared by tests/doctor/test_loop_doctor.py and test_doctor_checks.py)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import Dataset

from lightning_modules.models import MLP


def random_rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of 2 standard-normal features and labels in 0..2, from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, generator=generator), torch.randint(0, 3, (n,), generator=generator)


class SleepyDataset(Dataset):
    """``n`` random rows, each read after ``delay`` seconds of sleep (a slow loader)."""

    def __init__(self, n: int, delay: float) -> None:
        self.x, self.y = random_rows(n, seed=0)
        self.delay = delay

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return self.x[i], self.y[i]


class ForcesTrainMode(MLP):
    """A network whose forward switches itself to train mode, also during validation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.train()
        return super().forward(x)
