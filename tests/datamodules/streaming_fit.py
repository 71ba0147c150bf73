"""A plain ``lightning.Trainer`` fit of a ``StreamingTableDataModule`` (2 loader workers) on 2 CPU processes (DDP,
gloo), for the kill -9 test: ``python -m tests.datamodules.streaming_fit <parquet> <out dir> [kill_at_step]
[resume_ckpt]``. A checkpoint every 3 steps (``last.ckpt``); with ``kill_at_step`` rank 0 kills the whole process
group with SIGKILL at that step's start; the final weights go to ``<out>/weights.pt``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from datamodules.streaming_table import StreamingTableDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP


class KillGroupAtStep(Callback):
    """SIGKILL to the process group (both ranks and their loader workers) when step ``step`` starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.killpg(os.getpgid(0), signal.SIGKILL)


def main() -> None:
    path, out = sys.argv[1], Path(sys.argv[2])
    kill = int(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    resume = sys.argv[4] if len(sys.argv) > 4 else None
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    data = StreamingTableDataModule(path, "y", batch_size=32, window=512, num_workers=2, val_fraction=0.1,
                                    test_fraction=0.0)
    model = ClassificationModule(MLP(data.in_features, data.num_classes, hidden_sizes=[16]), num_classes=data.num_classes)
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=out, every_n_train_steps=3, save_last=True, save_top_k=0)]
    if kill is not None:
        callbacks.append(KillGroupAtStep(kill))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        limit_val_batches=2, num_sanity_val_steps=0, deterministic=True)
    trainer.fit(model, datamodule=data, ckpt_path=resume)
    if trainer.global_rank == 0:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, out / "weights.pt")
        torch.save(trainer.global_step, out / "steps.pt")


if __name__ == "__main__":
    main()
