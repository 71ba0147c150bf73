"""Random number generator states in every checkpoint, so a resumed run draws what an uninterrupted one would.

Lightning 2.6 restores the weights, optimizer, LR schedulers, loops and callback states from a checkpoint, but not
the global random generators: a resumed process starts from ``seed_everything``'s state, so dropout masks, random
augmentations and anything else drawn from torch's, NumPy's or Python's global generator differ from the run that
was never interrupted. ``RandomStates`` stores those states in the checkpoint and puts them back on resume.

Data order is not the generators' business: the loopwise samplers draw epoch ``e``'s order from ``seed + e``
(``EpochRandomSampler``, ``ClassBalancedSampler``, ``LengthBucketBatchSampler``), and loaders carry their own
seeded generator for worker seeds.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


def collect_random_states() -> dict[str, Any]:
    """The global generators' states as tensors and plain Python values (``torch.load(weights_only=True)`` reads
    them; NumPy arrays and Python's state tuple are converted)."""
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": str(kind),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "python": {
            "version": int(version),
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss_next": None if gauss_next is None else float(gauss_next),
        },
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["torch.cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict[str, Any]) -> None:
    """Set the global generators from ``collect_random_states()``'s output (missing entries are left alone; CUDA
    states only when this process sees the same number of devices)."""
    if "torch" in states:
        torch.set_rng_state(states["torch"].cpu())
    numpy_state = states.get("numpy")
    if numpy_state is not None:
        keys = np.asarray(numpy_state["keys"].cpu().numpy(), dtype=np.uint32)
        np.random.set_state(
            (
                numpy_state["kind"],
                keys,
                int(numpy_state["pos"]),
                int(numpy_state["has_gauss"]),
                float(numpy_state["cached_gaussian"]),
            )
        )
    python_state = states.get("python")
    if python_state is not None:
        internal = tuple(int(v) for v in python_state["state"].tolist())
        random.setstate((int(python_state["version"]), internal, python_state["gauss_next"]))
    cuda_states = states.get("torch.cuda")
    if cuda_states is not None and torch.cuda.is_available() and len(cuda_states) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])


class RandomStates(Callback):
    """Keep the global random generators (torch CPU and CUDA, NumPy, Python) in every checkpoint; restore them on
    resume.

    Works with a plain ``lightning.Trainer`` too. The states are those of the process that writes the checkpoint
    (rank 0 under DDP); ``seed_everything`` gives every rank the same seed, so with the default seeding all ranks
    hold the same states and each gets its own back. A checkpoint written without this callback resumes with the
    generators as ``seed_everything`` left them (Lightning's behaviour).
    """

    def state_dict(self) -> dict[str, Any]:
        return collect_random_states()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # called by Trainer.fit(ckpt_path=...) after the setup hooks and before the first batch
        restore_random_states(state_dict)


__all__ = ["RandomStates", "collect_random_states", "restore_random_states"]
