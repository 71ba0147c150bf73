"""Checkpoint files as recipes read them: one weights-only loader, the checks that make a bad ``--ckpt_path`` one
clear line before anything runs, and the ``loopwise`` stamp that ties a checkpoint to its MLflow run.

A checkpoint given to ``recipes`` is read once here (``inspect_checkpoint``), weights-only: a pickle that would
call a function is refused, never run. What the CLI needs later (the weights' shapes, the run stamp) is kept in a
``CheckpointSummary``; Lightning reads the file itself when it restores the training state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recipes.checkpoints.classes import ForeignClassPath, check_checkpoint_classes

STAMP_KEY = "loopwise"  # checkpoint["loopwise"] = {"mlflow_run_id": ..., "experiment": ...}

FIT_KEYS = ("loops", "optimizer_states", "global_step", "epoch")
ACCEPTED = (
    "loopwise reads checkpoints as Lightning and loopwise write them: tensors, plain Python values (dict, list, "
    "tuple, str, int, float, bool, None) and the few types torch's weights-only loader allows; ask for the "
    "checkpoint `recipes fit` or a Lightning Trainer wrote, or for the weights alone (torch.save(model.state_dict(), "
    "path))"
)
_UNSAFE_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (?P<name>[\w.]+)")


class CheckpointError(ValueError):
    """A ``--ckpt_path`` file that is not a usable checkpoint (unreadable, unsafe, foreign or for another model)."""


def load_checkpoint_weights_only(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU (memory-mapped when the file allows it), with the reason in
    a ``CheckpointError`` when the file is truncated, not a torch file, or needs to unpickle arbitrary objects.

    Weights-only loading never runs code from the file: a pickle that would call a function is refused, not run.
    """
    path = Path(path)
    try:
        try:
            return torch.load(path, weights_only=True, map_location="cpu", mmap=True)
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
            return torch.load(path, weights_only=True, map_location="cpu")  # not the zip format: no mmap
    except Exception as err:  # noqa: BLE001  (torch raises many types for a bad file; the message says which)
        raise CheckpointError(f"--ckpt_path {path}: {describe_load_error(path, err)}") from None


def describe_load_error(path: Path, err: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in one line. torch's own text is not quoted where it advises
    loading the file without the guard (``weights_only=False``) or allow-listing its classes: loopwise never loads a
    pickle that needs them, so the line says what it reads instead (``ACCEPTED``)."""
    text = str(err)
    unsafe = _UNSAFE_GLOBAL.search(text)
    if unsafe is not None or "Weights only load failed" in text:
        name = repr(unsafe["name"]) if unsafe is not None else "an object that is not a tensor or plain value"
        return (
            f"refused to load: the file needs to unpickle {name}, which is neither a tensor nor a plain value "
            f"(unpickling it could run code, so it is never loaded); {ACCEPTED}"
        )
    if "TorchScript" in text:
        return f"refused to load: the file is a TorchScript archive (torch.jit.save), not a checkpoint; {ACCEPTED}"
    size = path.stat().st_size if path.exists() else 0
    if size == 0:
        return "the file is empty (0 bytes): not a checkpoint"
    if "central directory" in text or "zip archive" in text or isinstance(err, EOFError) or _torch_file_start(path):
        return (
            f"the file is truncated or corrupt ({size:,} bytes; torch: "
            f"{text.split('. ')[0][:120] or type(err).__name__}); copy it again, or use an earlier checkpoint"
        )
    return f"not a PyTorch checkpoint file ({size:,} bytes; torch.load failed: {type(err).__name__} {text[:120]})"


def _torch_file_start(path: Path) -> bool:
    """Whether the file starts as ``torch.save`` files do (a zip archive's first entry named ``<archive>/...``, or
    the legacy format's pickle protocol byte), so a load that fails means the rest is missing or damaged."""
    try:
        with path.open("rb") as handle:
            head = handle.read(64)
    except OSError:
        return False
    return (head.startswith(b"PK\x03\x04") and b"/" in head[30:64]) or head[:2] in (b"\x80\x02", b"\x80\x04")


def check_checkpoint(path: str | Path, subcommand: str | None, loaded: Any = None) -> dict[str, Any]:
    """Load ``path`` weights-only (unless ``loaded`` is its content, read already) and check it is a Lightning
    checkpoint: a dict with a ``state_dict``; for ``fit`` also the loop and optimizer states that resuming needs.
    Returns the loaded checkpoint (memory-mapped).

    Raises ``CheckpointError`` naming the file and the problem.
    """
    ckpt = load_checkpoint_weights_only(path) if loaded is None else loaded
    if not isinstance(ckpt, dict):
        raise CheckpointError(
            f"--ckpt_path {path}: not a Lightning checkpoint: the file holds a {type(ckpt).__name__}, not a dict "
            "with 'state_dict' (a Lightning checkpoint is written by Trainer.save_checkpoint or ModelCheckpoint)"
        )
    state = ckpt.get("state_dict")
    if not isinstance(state, dict):
        keys = ", ".join(sorted(map(str, ckpt))[:8]) or "none"
        raise CheckpointError(
            f"--ckpt_path {path}: not a Lightning checkpoint: no 'state_dict' (its keys: {keys}); a plain "
            "model.state_dict() file can be loaded with module.load_state_dict(torch.load(path)) instead"
        )
    if subcommand == "fit":
        missing = [key for key in FIT_KEYS if key not in ckpt]
        if missing:
            raise CheckpointError(
                f"--ckpt_path {path}: cannot resume training from it: it has no {', '.join(missing)} (a weights-only "
                "checkpoint); use it with validate/test/predict, or start a new fit without --ckpt_path"
            )
    return ckpt


def check_state_dict_matches(path: str | Path, checkpoint_shapes: dict[str, Any], module: torch.nn.Module) -> None:
    """Compare a checkpoint's ``state_dict`` (``{key: shape}``) with ``module``'s: missing or unexpected keys (when the
    module loads strictly) and shape mismatches end in one ``CheckpointError`` that names the first few of each."""
    own = module.state_dict()
    strict = bool(getattr(module, "strict_loading", True))
    problems = []
    if strict:
        missing = [k for k in own if k not in checkpoint_shapes]
        unexpected = [k for k in checkpoint_shapes if k not in own]
        if missing:
            problems.append(f"{len(missing)} missing key(s) ({_first(missing)})")
        if unexpected:
            problems.append(f"{len(unexpected)} unexpected key(s) ({_first(unexpected)})")
    shapes = []
    for key, shape in checkpoint_shapes.items():
        mine = own.get(key)
        if not isinstance(mine, torch.Tensor) or isinstance(mine, torch.nn.parameter.UninitializedTensorMixin):
            continue
        if tuple(mine.shape) != tuple(shape):
            shapes.append(f"{key}: checkpoint {tuple(shape)} vs model {tuple(mine.shape)}")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) ({_first(shapes)})")
    if problems:
        raise CheckpointError(
            f"--ckpt_path {path}: its weights do not fit this recipe's {type(module).__name__}: "
            + "; ".join(problems)
            + ". Is it a checkpoint of another recipe or model configuration?"
        )


def _first(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (", ..." if len(items) > n else "")


def check_checkpoint_recipe(path: str | Path, ckpt: dict[str, Any], data_class_path: str | None) -> None:
    """A checkpoint written by another recipe (another data module class) is refused with both names.

    LightningCLI (2.6) rebuilds the model from a checkpoint's ``hyper_parameters`` (``--model`` options and the YAML's
    ``model:`` are overridden by them), so another recipe's checkpoint would otherwise bring its network to this
    recipe's data and fail later, or worse, not at all.
    """
    saved = ckpt.get("datamodule_hyper_parameters")
    saved_path = saved.get("_class_path") if isinstance(saved, dict) else None
    if not saved_path or not data_class_path:
        return
    saved_name, this_name = str(saved_path).rsplit(".", 1)[-1], str(data_class_path).rsplit(".", 1)[-1]
    if saved_name == this_name:
        return
    stamp = ckpt.get(STAMP_KEY)
    experiment = stamp.get("experiment") if isinstance(stamp, dict) else None
    origin = f" (experiment {experiment!r})" if experiment else ""
    raise CheckpointError(
        f"--ckpt_path {path}: it was trained on {saved_name}{origin}, but this recipe's data is {this_name}: a "
        "checkpoint of another recipe? Use it with the recipe that wrote it"
    )


def run_stamp(ckpt: Any) -> dict[str, str]:
    """The ``loopwise`` stamp of a loaded checkpoint: ``{"mlflow_run_id": ..., "experiment": ...}`` (``{}`` if none)."""
    stamp = ckpt.get(STAMP_KEY) if isinstance(ckpt, dict) else None
    return {str(k): str(v) for k, v in stamp.items()} if isinstance(stamp, dict) else {}


def read_run_stamp(path: str | Path) -> dict[str, str]:
    """The ``loopwise`` stamp of a checkpoint file (``{}`` when it has none or cannot be read as weights only)."""
    try:
        return run_stamp(load_checkpoint_weights_only(path))
    except CheckpointError:
        return {}


@dataclass(frozen=True)
class CheckpointSummary:
    """What the CLI keeps of a checked ``--ckpt_path`` file after reading it once."""

    path: str
    shapes: dict[str, Any] = field(repr=False)
    stamp: dict[str, str]
    data_settings: dict[str, Any] | None = None  # the data module's saved hyperparameters, if any
    data_content: dict[str, Any] | None = None  # the data's content digests (``loopwise_data``), if any
    data_state: dict[str, Any] | None = field(default=None, repr=False)  # its state_dict: encodings, vocabularies


def check_finite_weights(path: str | Path, state_dict: dict[str, Any]) -> None:
    """A checkpoint whose weights hold NaN or inf is refused by every command (it would train or predict NaN)."""
    bad = []
    for name, value in state_dict.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            count = int((~torch.isfinite(value)).sum())
            if count:
                bad.append((name, count))
    if bad:
        first, count = bad[0]
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        raise CheckpointError(
            f"--ckpt_path {path}: the weights are not finite: {first} has {count} NaN/inf value(s){more}; use an "
            "earlier checkpoint (the run's best.ckpt, or one from before the loss diverged)"
        )


def inspect_checkpoint(
    path: str | Path,
    subcommand: str | None,
    data_class_path: str | None,
    loaded: Any = None,
    model_config: Any = None,
) -> CheckpointSummary:
    """Read ``path`` once, weights only (or take ``loaded``, its content read already when ``best``/``last`` chose
    it), and run every check on it: a Lightning checkpoint (for ``fit`` with the states resuming needs) of this
    recipe's data module, whose hyperparameters name no class (no import path) that ``model_config`` (the parsed
    config's ``model``) does not name at the same place (``checkpoint_classes``: compared as text, nothing imported).
    Returns its weights' shapes, its run stamp and the data settings it was trained with.

    Raises ``CheckpointError`` naming the file and the problem.
    """
    ckpt = check_checkpoint(path, subcommand, loaded)
    check_checkpoint_recipe(path, ckpt, data_class_path)
    try:
        check_checkpoint_classes(str(path), ckpt.get("hyper_parameters"), model_config)
    except ForeignClassPath as err:
        raise CheckpointError(str(err)) from None
    check_finite_weights(path, ckpt["state_dict"])
    shapes = {k: v.shape for k, v in ckpt["state_dict"].items() if hasattr(v, "shape")}
    saved_data = ckpt.get("datamodule_hyper_parameters")
    data_settings = dict(saved_data) if isinstance(saved_data, dict) else None
    # Lightning stores a data module's state_dict under its class's __qualname__
    state = ckpt.get(data_class_path.rsplit(".", 1)[-1]) if data_class_path else None
    return CheckpointSummary(
        path=str(path),
        shapes=shapes,
        stamp=run_stamp(ckpt),
        data_settings=data_settings,
        data_content=ckpt.get("loopwise_data") if isinstance(ckpt.get("loopwise_data"), dict) else None,
        data_state=state if isinstance(state, dict) and state else None,
    )
