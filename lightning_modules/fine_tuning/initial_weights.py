"""Initial weights for a network from a file: a Lightning checkpoint, a state-dict file or a safetensors file.

``InitialWeights`` says where the weights come from and how the file's keys map onto the network's parameter names;
``load_initial_weights`` loads them (weights only: a file never chooses what code runs) and returns a
``WeightsReport`` of what was loaded, what the network has that the file lacks, what the file has that the network
lacks, and what differs in shape. A mismatch is an error unless ``strict`` is off.
"""

from __future__ import annotations

import fnmatch
import pickle
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    from typing import Required, TypedDict
else:  # Required came in 3.11; torch depends on typing_extensions
    from typing_extensions import Required, TypedDict

import torch
from torch import Tensor, nn

#: file suffixes read as a Lightning checkpoint (its ``state_dict``), a torch state dict, or safetensors
CHECKPOINT_SUFFIXES = (".ckpt",)
STATE_DICT_SUFFIXES = (".pt", ".pth", ".bin")
SAFETENSORS_SUFFIXES = (".safetensors",)
#: where a loopwise task keeps its network: the prefix of the network's keys in a task checkpoint
TASK_NETWORK_PREFIX = "model."
SHOWN_KEYS = 5
#: the first byte of a pickle of protocol 2 or later (``torch.save``'s legacy, non-zip format)
PICKLE_PROTO = b"\x80"
#: the first bytes of a zip archive (``torch.save``'s format)
ZIP_MAGIC = b"PK\x03\x04"


class InitialWeightsSpec(TypedDict, total=False):
    """``init_from``'s long form in a config: ``{path, strip_prefix, add_prefix, into, exclude, strict}`` (see
    ``InitialWeights``). A typed mapping rather than the class, so that jsonargparse treats a string ``init_from`` as
    the file name it is: for a class (or a dataclass) it would read an existing file named there as a sub-config,
    and import the ``class_path`` that file names; the file is only ever read as weights."""

    path: Required[str]
    strip_prefix: str | None
    add_prefix: str
    into: str
    exclude: list[str]
    strict: bool


class InitialWeights:
    """Where a network's initial weights come from, and how the file's keys map onto the network.

    Args:
        path: A Lightning checkpoint (``.ckpt``: its ``state_dict``), a state-dict file saved with ``torch.save``
            (``.pt``, ``.pth``, ``.bin``: a mapping of names to tensors, or one under a ``state_dict`` or ``model``
            key) or a ``.safetensors`` file. ``recipes`` also takes ``mlflow:<run id>/best|last`` (an earlier run's
            checkpoint). Read weights-only: a file never chooses what code runs.
        strip_prefix: Remove this prefix from the file's keys (keys without it are left out). Default for a
            ``.ckpt``: "model." when it has keys under it (a loopwise task's checkpoint: its network), else "".
        add_prefix: Put this prefix in front of every key after stripping (e.g. "backbone." to load a plain
            network's weights into the ``backbone`` of yours).
        into: Load into this submodule of the network (a dotted name, e.g. "features") instead of the whole network;
            missing keys are then counted within it only.
        exclude: Key patterns (``fnmatch``, on the keys after mapping) left out of the file, e.g. ``["head.*"]`` to
            start a new head for other classes; a pattern without wildcards also names everything under it.
        strict: A key the network has and the file lacks (outside ``exclude``), a key the file has and the network
            lacks, or a shape that differs is an error naming them. ``False`` loads what matches and reports the rest.
    """

    def __init__(
        self,
        path: str,
        strip_prefix: str | None = None,
        add_prefix: str = "",
        into: str = "",
        exclude: list[str] | None = None,
        strict: bool = True,
    ) -> None:
        if not isinstance(path, str) or not path.strip():
            raise ValueError(f"init_from: path must be a file name, got {path!r}")
        self.path = path
        self.strip_prefix = strip_prefix
        self.add_prefix = add_prefix
        self.into = into
        self.exclude = list(exclude or [])
        self.strict = strict

    @classmethod
    def of(cls, value: str | InitialWeights | Mapping[str, Any] | None) -> InitialWeights | None:
        """``value`` as ``InitialWeights``: a path string becomes ``InitialWeights(path)``; ``None`` stays ``None``."""
        if value is None or isinstance(value, InitialWeights):
            return value
        if isinstance(value, str):
            return cls(value)
        if isinstance(value, Mapping):
            return cls(**dict(value))
        raise TypeError(f"init_from: expected a file name or InitialWeights, got {type(value).__name__}")

    def with_path(self, path: str) -> InitialWeights:
        """The same mapping for another file (e.g. the local copy of an ``mlflow:`` reference)."""
        return InitialWeights(path, self.strip_prefix, self.add_prefix, self.into, self.exclude, self.strict)

    def describe(self) -> dict[str, Any]:
        """Flat description (logged to the tracker)."""
        return {k: v for k, v in vars(self).items() if v not in (None, "", [])}


@dataclass
class WeightsReport:
    """What ``load_initial_weights`` did: keys loaded, missing (in the network, not in the file), unexpected (in
    the file, not in the network), excluded, and (key, file shape, network shape) of the shapes that differ;
    ``file`` is the file read (``source`` itself, or the local copy of the tracked run that ``source`` names)."""

    source: str
    target: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    loaded_parameters: int = 0
    file: str = ""

    @property
    def complete(self) -> bool:
        """Every key of the target loaded, nothing left over, no shape differs (excluded keys aside)."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        """One line: "init_from x.ckpt: 12 tensors (1,234 parameters) loaded into the network; 2 missing: ..."."""
        parts = [f"init_from {self.source}: {len(self.loaded)} tensors ({self.loaded_parameters:,} parameters) "
                 f"loaded into {self.target}"]
        for name, keys in (("missing", self.missing), ("unexpected", self.unexpected), ("excluded", self.excluded)):
            if keys:
                parts.append(f"{len(keys)} {name}: {show_keys(keys)}")
        if self.mismatched:
            parts.append(f"{len(self.mismatched)} of another shape: {show_shapes(self.mismatched)}")
        return "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON) for the tracker."""
        return asdict(self)


def show_keys(keys: list[str], limit: int = SHOWN_KEYS) -> str:
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def show_shapes(mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]], limit: int = SHOWN_KEYS) -> str:
    shown = [f"{key} file {tuple(a)} vs network {tuple(b)}" for key, a, b in mismatched[:limit]]
    more = f" (+{len(mismatched) - limit} more)" if len(mismatched) > limit else ""
    return ", ".join(shown) + more


def read_weights(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a weights file by name (see ``InitialWeights.path``), read weights-only on the CPU.

    The file is only ever read here, as weights: an empty file, one that is not what ``torch.save`` or safetensors
    writes (a text file, a YAML config) or a pickle that would run code is refused. Raises ``FileNotFoundError`` or
    ``ValueError`` with one line naming the file, the problem and the fix.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"init_from: no file {file.resolve()}")
    suffix = file.suffix.lower()
    known = CHECKPOINT_SUFFIXES + STATE_DICT_SUFFIXES + SAFETENSORS_SUFFIXES
    if suffix not in known:
        raise ValueError(f"init_from: {file.name} has suffix {suffix or '(none)'!r}; expected one of {', '.join(known)}")
    if file.stat().st_size == 0:
        raise ValueError(f"init_from: {file} is empty (0 bytes); point init_from at the weights: "
                         "torch.save(network.state_dict(), path)")
    if suffix in SAFETENSORS_SUFFIXES:
        try:
            from safetensors import SafetensorError  # noqa: PLC0415
            from safetensors.torch import load_file  # noqa: PLC0415
        except ImportError:
            raise ImportError(f"init_from: {file.name} is a safetensors file, and reading one needs safetensors: "
                              "pip install 'loopwise[recipes]' (or pip install safetensors)") from None

        try:
            return load_file(str(file), device="cpu")
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"init_from: {file} is not a readable safetensors file ({err})") from err
    not_torch_file = torch_file_problem(file)
    if not_torch_file:
        raise ValueError(f"init_from: {file} is not a weights file ({not_torch_file}); save the weights with "
                         "torch.save(network.state_dict(), path)")
    try:
        content = torch.load(file, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError) as err:
        raise ValueError(
            f"init_from: {file} cannot be read weights-only ({load_failure(err)}): it holds more than tensors and "
            "plain values, and a weights file is never loaded in a way that could run code; save plain tensors: "
            "torch.save(network.state_dict(), path)"
        ) from err
    for key in ("state_dict", "model"):
        if isinstance(content, Mapping) and isinstance(content.get(key), Mapping):
            content = content[key]
            break
    if not isinstance(content, Mapping) or not content:
        raise ValueError(f"init_from: {file} holds no state dict (a mapping of names to tensors)")
    tensors = {k: v for k, v in content.items() if isinstance(v, Tensor)}
    if not tensors:
        raise ValueError(f"init_from: {file} holds no tensors")
    return tensors


def torch_file_problem(file: Path) -> str:
    """Why ``file`` is not what ``torch.save`` writes (a zip archive, or a pickle in the legacy format); "" if it is."""
    try:
        with file.open("rb") as handle:
            head = handle.read(64)
        if zipfile.is_zipfile(file) or head[:1] == PICKLE_PROTO:
            return ""
    except OSError as err:
        return f"it cannot be read: {err.strerror or err}"
    if head.startswith(ZIP_MAGIC):
        return "a damaged or truncated zip archive: copy or save it again"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return "not the zip archive torch.save writes"
    return "it holds text, not the zip archive torch.save writes"


#: where torch's weights-only error starts advising to load the file anyway (``weights_only=False``) or to
#: allow-list its classes: never quoted, a weights file is never loaded that way
TORCH_ADVICE = ("In PyTorch 2.6", "Please use `torch.serialization", "Re-running `torch.load`",
                "This file can still be loaded")


def load_failure(err: Exception) -> str:
    """The reason in ``torch.load``'s weights-only error, without torch's advice to load the file without the guard
    or to allow-list what it holds (``TORCH_ADVICE``)."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        text = text.split("WeightsUnpickler error:", 1)[1]
    for advice in TORCH_ADVICE:
        text = text.split(advice, 1)[0]
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0].rstrip(". ") if lines else type(err).__name__


def default_strip_prefix(path: str | Path, keys: list[str]) -> str:
    """"model." for a Lightning checkpoint with keys under it (a loopwise task keeps its network there; its other
    keys, such as class weights, are not the network's), else ""."""
    if Path(path).suffix.lower() in CHECKPOINT_SUFFIXES and any(k.startswith(TASK_NETWORK_PREFIX) for k in keys):
        return TASK_NETWORK_PREFIX
    return ""


def matches(key: str, patterns: list[str]) -> bool:
    """Whether ``key`` matches a pattern (``fnmatch``), or is a name under one (``pattern.*``)."""
    return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(key, f"{p}.*") for p in patterns)


def map_keys(
    tensors: dict[str, Tensor], spec: InitialWeights, file: str | Path | None = None
) -> tuple[dict[str, Tensor], list[str]]:
    """The tensors of ``file`` (default ``spec.path``) under the names the target module uses, and the keys left
    out by ``exclude``."""
    keys = list(tensors)
    strip = spec.strip_prefix if spec.strip_prefix is not None else default_strip_prefix(file or spec.path, keys)
    mapped: dict[str, Tensor] = {}
    excluded: list[str] = []
    for key, value in tensors.items():
        if strip:
            if not key.startswith(strip):
                continue
            key = key[len(strip):]
        key = spec.add_prefix + key
        if matches(key, spec.exclude):
            excluded.append(key)
            continue
        mapped[key] = value
    return mapped, excluded


def load_initial_weights(network: nn.Module, spec: InitialWeights, path: str | None = None) -> WeightsReport:
    """Load ``spec``'s file (or ``path``, its local copy) into ``network`` (or its ``spec.into`` submodule).

    Strict (the default): nothing is loaded unless every key matches in name and shape, and the ``ValueError``
    names the keys and shapes that do not. Not strict: the matching tensors are loaded, the rest reported.
    """
    target_name = spec.into or ""
    try:
        target = network.get_submodule(target_name) if target_name else network
    except AttributeError as err:
        names = [n for n, _ in network.named_children()]
        raise ValueError(f"init_from.into: the network has no submodule {target_name!r} (it has {names})") from err
    tensors, excluded = map_keys(read_weights(path or spec.path), spec, path or spec.path)
    own = target.state_dict()
    report = WeightsReport(source=spec.path, target=f"network.{target_name}" if target_name else "the network",
                           excluded=excluded, file=str(path or spec.path))
    usable: dict[str, Tensor] = {}
    for key, value in tensors.items():
        if key not in own:
            report.unexpected.append(key)
        elif tuple(own[key].shape) != tuple(value.shape):
            report.mismatched.append((key, tuple(value.shape), tuple(own[key].shape)))
        else:
            usable[key] = value
    check_dtypes(usable, own, spec.path)
    report.missing = [k for k in own if k not in tensors and not matches(k, spec.exclude)]
    if spec.strict and not report.complete:
        parts = parts_that_differ(report)
        rest_loads = any(not matches(key, parts) for key in usable)  # leaving the parts out would still load some
        leave_out = f", leave parts out (init_from.exclude: {show_parts(parts)})" if parts and rest_loads else ""
        raise ValueError(
            f"{report.summary()}. Map the keys (init_from.strip_prefix / add_prefix / into){leave_out} or load what "
            "matches with init_from.strict: false"
        )
    if not usable:
        raise ValueError(f"{report.summary()}: no key of the file matches the network (check strip_prefix/into)")
    check_finite(usable, spec.path)
    target.load_state_dict(usable, strict=False)
    report.loaded = list(usable)
    report.loaded_parameters = sum(v.numel() for k, v in usable.items() if k in dict(target.named_parameters()))
    return report


def parts_that_differ(report: WeightsReport) -> list[str]:
    """The modules (a key less its last name: ``net.6`` for ``net.6.weight``) holding the keys of another shape, the
    keys the network lacks or the keys the file lacks, in order: what ``init_from.exclude`` would leave out."""
    keys = [key for key, _, _ in report.mismatched] + report.unexpected + report.missing
    return list(dict.fromkeys(key.rpartition(".")[0] or key for key in keys))


def show_parts(parts: list[str], limit: int = SHOWN_KEYS) -> str:
    """``parts`` as the YAML list to write (up to ``limit`` of them named)."""
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return "[" + ", ".join(repr(p) for p in parts[:limit]) + "]" + more


def check_dtypes(tensors: dict[str, Tensor], own: dict[str, Tensor], source: str) -> None:
    """Integer and boolean tensors are not weights: one loads only where the network's own tensor has its dtype (a
    count such as ``num_batches_tracked``), and a floating-point one never goes into an integer or boolean tensor."""
    wrong = [k for k, v in tensors.items()
             if v.dtype != own[k].dtype and not (v.dtype.is_floating_point and own[k].dtype.is_floating_point)
             and not (v.is_complex() and own[k].is_complex())]
    if wrong:
        key = wrong[0]
        more = f" (and {len(wrong) - 1} more tensors)" if len(wrong) > 1 else ""
        raise ValueError(
            f"init_from: {source}: {key} is {dtype_name(tensors[key])} in the file, {dtype_name(own[key])} in the "
            f"network{more}; integer and boolean tensors are not weights: save the network's own tensors "
            "(torch.save(network.state_dict(), path))"
        )


def check_finite(tensors: dict[str, Tensor], source: str) -> None:
    """A NaN or infinite value among the weights to load is an error naming the tensor (a diverged run's file)."""
    for key, value in tensors.items():
        if not (value.is_floating_point() or value.is_complex()) or bool(torch.isfinite(value).all()):
            continue
        nan = int(torch.isnan(value).sum())
        inf = int(torch.isinf(value).sum())
        counts = " and ".join(f"{n} {name}" for n, name in ((nan, "NaN"), (inf, "inf")) if n)
        raise ValueError(
            f"init_from: {source}: {key} holds {counts} value(s) of {value.numel():,}; the file's weights are broken "
            "(a diverged run?): start from another file, such as an earlier checkpoint"
        )


def dtype_name(tensor: Tensor) -> str:
    """``int64`` for ``torch.int64``."""
    return str(tensor.dtype).removeprefix("torch.")


__all__ = ["InitialWeights", "InitialWeightsSpec", "WeightsReport", "load_initial_weights", "read_weights"]
