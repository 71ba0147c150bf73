"""No host-device synchronisation on ordinary training and evaluation batches, in every recipe (issue 17, items 3-4).

A value read back to the host (``.item()``, ``bool(t)``, ``float(t)``, ``.tolist()``, ``.cpu()``, a data-dependent
shape such as ``nonzero``/``unique``/``bincount``) makes the CPU wait for the GPU. On this CPU-only machine the
calls themselves are counted instead: the tensor methods and torch functions that would sync on a GPU are wrapped
for the duration of each batch, from the first callback's batch-start hook through the module's batch-end hook
(every callback's and the module's batch hooks, the training step, backward, clipping, the optimizer step).

Ordinary batches are the ones where nothing is read: a training batch that is not a logging step
(``log_every_n_steps``), not the epoch's last batch and not the run's last step, and a validation batch that is not
its dataloader's last. Those are allowed one read: the loop doctor's device-side flags, the train metrics and the
logged loss are read there (see ``recipes.doctor.current_step`` and ``lightning_modules.task``).
"""

from __future__ import annotations

import collections
import traceback
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import Callback

from recipes.doctor.read_steps import is_read_step
from lightning_modules.task import Task
from recipes.cli import main
from tests.conftest import CONFIGS, REPO
from tests.hf_models import hf_overrides

RECIPES = sorted(CONFIGS.glob("*.yaml"))
TENSOR_METHODS = (
    "item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__", "__format__", "nonzero",
    "unique", "bincount", "masked_select",
)
TORCH_FUNCTIONS = ("nonzero", "unique", "bincount", "masked_select", "equal", "allclose", "is_nonzero")
# a small run of every recipe: 6 training batches, logging steps at batches 2 and 5 (5 is also the epoch's last), so
# batches 0, 1, 3 and 4 are ordinary; validation batches 0 and 1 of 3 are ordinary (sanity check: batch 0 of 2)
SMALL = [
    "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "3",
    "--trainer.log_every_n_steps", "3",
]


# reads of tensors that live on the host by design, on a GPU too: torch's non-fused optimizers keep their ``step``
# counters on the CPU (``_get_value`` reads them); the fused AdamW loopwise builds on CUDA keeps them on the device
HOST_RESIDENT = ("torch/optim/optimizer.py", "_get_value")
# a Hugging Face network (configs/text_finetune_hf.yaml) reads its attention mask once per forward, in transformers'
# own code, to drop the mask when nothing is padded (SDPA's fast kernels): transformers' choice, allowed; the code of
# loopwise around it must still read nothing
HF_MASK_CHECK = "transformers/masking_utils.py"


class HostReads:
    """Counts the calls that would read a device value back to the host, while a window is open."""

    def __init__(self) -> None:
        self.window: tuple[str, int] | None = None  # (stage, batch index) of the ordinary batch in progress
        self.ordinary: collections.Counter[str] = collections.Counter()
        self.reads: list[tuple[str, int, str, str]] = []  # (stage, batch, call, where)

    def wrap(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.window is not None:
                frames = traceback.extract_stack()[:-1][::-1]
                caller = frames[0]
                if not (caller.filename.endswith(HOST_RESIDENT[0]) and caller.name == HOST_RESIDENT[1]):
                    where = " < ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}" for f in frames[:3])
                    self.reads.append((*self.window, name, where))
            return original(*args, **kwargs)

        return counted

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        for name in TENSOR_METHODS:
            monkeypatch.setattr(torch.Tensor, name, self.wrap(name, getattr(torch.Tensor, name)))
        for name in TORCH_FUNCTIONS:
            monkeypatch.setattr(torch, name, self.wrap(f"torch.{name}", getattr(torch, name)))

    def open(self, stage: str, batch_idx: int, ordinary: bool) -> None:
        self.window = (stage, batch_idx) if ordinary else None
        if ordinary:
            self.ordinary[stage] += 1

    def close(self) -> None:
        self.window = None


class OpenWindow(Callback):
    """The first callback: opens the counting window on ordinary batches (the module's batch-end hook closes it)."""

    def __init__(self, reads: HostReads) -> None:
        self.reads = reads

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.reads.open("train", batch_idx, not is_read_step(trainer))

    def on_validation_batch_start(
        self, trainer: pl.Trainer, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        last = batch_idx + 1 in trainer.num_val_batches
        self.reads.open("sanity" if trainer.sanity_checking else "val", batch_idx, not last)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_ordinary_batches_read_nothing_back(workdir: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if (REPO / "data").is_dir():
        (workdir / "data").symlink_to(REPO / "data")
    reads = HostReads()
    fit = pl.Trainer.fit

    def fit_with_window(trainer: pl.Trainer, *args: Any, **kwargs: Any) -> Any:
        trainer.callbacks.insert(0, OpenWindow(reads))
        reads.install(monkeypatch)  # after the run is set up: only the training loop is counted
        return fit(trainer, *args, **kwargs)

    def closing(hook: Any) -> Any:
        def close(self: Task, *args: Any, **kwargs: Any) -> Any:
            try:
                return hook(self, *args, **kwargs)
            finally:
                reads.close()

        return close

    monkeypatch.setattr(pl.Trainer, "fit", fit_with_window)
    monkeypatch.setattr(Task, "on_train_batch_end", closing(Task.on_train_batch_end))
    monkeypatch.setattr(Task, "on_validation_batch_end", closing(Task.on_validation_batch_end))
    main(["fit", "-c", str(recipe), *hf_overrides(recipe), *SMALL])
    monkeypatch.undo()
    assert reads.ordinary["train"] == 4 and reads.ordinary["val"] == 2, reads.ordinary
    in_transformers = collections.Counter(read[:2] for read in reads.reads if read[3].startswith(HF_MASK_CHECK))
    assert all(count == 1 for count in in_transformers.values()), in_transformers  # one per forward at most
    ours = [read for read in reads.reads if not read[3].startswith(HF_MASK_CHECK)]
    assert ours == [], "host reads on ordinary batches:\n" + "\n".join(map(str, ours[:20]))
