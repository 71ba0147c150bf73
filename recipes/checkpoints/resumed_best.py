"""A fit resumed anywhere keeps the best of its run's whole history.

A ``RunCheckpoint``'s state in a checkpoint (Lightning's ``ModelCheckpoint.state_dict``: ``best_model_score``,
``best_k_models``, ``best_model_path``, ...) names the folder it was written in (``dirpath``). Lightning drops all of
it but ``best_model_path`` when a run resumes in another folder (``recipes fit --ckpt_path mlflow:<id>/last`` in a
teammate's directory, a ``last.ckpt`` copied elsewhere), with a "The dirpath has changed" warning: the first
validation after the resume then overwrote ``best.ckpt``, its uploaded copy and the logged MLflow model with a
worse epoch.

Here the state is re-pointed to the new folder (``repointed``) and the best checkpoint file is put there when it
is not (``restore_best``): copied from the old folder when it exists on this machine, else fetched from the run's
artifact ``checkpoints/best.ckpt`` in the tracking store. A file is taken only when its own state says it holds the
state's best value (an older best, from a store that missed the last upload, is taken with its own state, never a
file from after the resumed step); a file already in the new folder that is another one is kept aside, never
overwritten. Without any such file the best restarts from this resume, as Lightning does, and the line says so.
In the folder the checkpoint was written in, ``best.ckpt`` is not read: the state's ``best_epoch``/``best_step``
(``RunCheckpoint.state_dict``) say where its best was reached.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from recipes.checkpoints.fetched import download_checked
from recipes.checkpoints.files import CheckpointError, load_checkpoint_weights_only

BEST_FILE = "best.ckpt"


@dataclass(frozen=True)
class BestFile:
    """What a ``best.ckpt`` says about itself: the monitored value its callback state holds, its epoch and step."""

    path: Path
    score: float | None
    epoch: int | None
    step: int | None
    state: dict[str, Any] | None  # the callback's state in the file (its best_k_models, ...)


@dataclass(frozen=True)
class ResumedBest:
    """The best a resumed run keeps: the callback state to load, and where the best file came from."""

    state: dict[str, Any]
    file: BestFile | None  # None: no best yet (or none could be found: then ``origin`` says why)
    origin: str  # "" (already here), "copied from <path>", "fetched from the store", or why there is none


def repointed(state: Mapping[str, Any], dirpath: str) -> dict[str, Any]:
    """``state`` (a ``ModelCheckpoint`` state) with its folder and every file path in it moved to ``dirpath``."""
    old = state.get("dirpath")

    def move(path: Any) -> Any:
        if not isinstance(path, str) or not path or not old:
            return path
        try:
            return str(Path(dirpath) / Path(path).relative_to(old))
        except ValueError:
            return path

    moved = dict(state)
    moved["dirpath"] = dirpath
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in moved:
            moved[key] = move(moved[key])
    if isinstance(state.get("best_k_models"), Mapping):
        moved["best_k_models"] = {move(path): value for path, value in state["best_k_models"].items()}
    return moved


def as_float(value: Any) -> float | None:
    """A monitored value (a tensor, a float) as a float; ``None`` when there is none."""
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def read_best_file(path: Path, state_key: str) -> BestFile | None:
    """What ``path`` says about itself (weights-only read), or ``None`` when it is missing or not a checkpoint."""
    if not path.is_file():
        return None
    try:
        ckpt = load_checkpoint_weights_only(path)
    except CheckpointError:
        return None
    if not isinstance(ckpt, dict):
        return None
    state = (ckpt.get("callbacks") or {}).get(state_key)
    state = state if isinstance(state, dict) else None
    epoch, step = ckpt.get("epoch"), ckpt.get("global_step")
    return BestFile(
        path,
        as_float(state.get("best_model_score")) if state else None,
        int(epoch) if epoch is not None else None,
        int(step) if step is not None else None,
        state,
    )


def same_value(a: float | None, b: float | None) -> bool:
    """The same monitored value (a saved tensor read back: equal, or both NaN)."""
    if a is None or b is None:
        return False
    return a == b or (math.isnan(a) and math.isnan(b))


def install(source: Path, target: Path, move: bool) -> str:
    """Put ``source`` at ``target`` (written beside it, then renamed into place); a different file already at
    ``target`` is kept as ``best.replaced-<time>.ckpt``. Returns a note about the kept file, or ``""``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    note = ""
    if target.exists() and target.resolve() != source.resolve():
        aside = target.with_name(f"{target.stem}.replaced-{datetime.now().strftime('%Y%m%d-%H%M%S')}.ckpt")
        os.replace(target, aside)
        note = f"; the {target.name} that was here is kept as {aside.name}"
    staged = target.with_name(f".{target.name}.resume-{os.getpid()}")
    if move:
        shutil.move(str(source), staged)
    else:
        shutil.copyfile(source, staged)
    os.replace(staged, target)
    return note


def restore_best(
    state: Mapping[str, Any],
    dirpath: str,
    state_key: str,
    resumed_step: int | None,
    fetch: Callable[[str, Path], Path | None],
    resumed_file: str | None = None,
) -> ResumedBest:
    """The best a run resumed into ``dirpath`` keeps (module docstring).

    ``state``: the best callback's state in the resumed checkpoint; ``resumed_step``: that checkpoint's step;
    ``fetch(run_id, folder)``: a copy of that run's ``checkpoints/best.ckpt`` downloaded into ``folder`` (``None``
    when there is none); ``resumed_file``: the resumed checkpoint, itself the best when written at the best's step
    (``--ckpt_path`` of a ``best.ckpt``).
    """
    moved = repointed(state, dirpath)
    score = as_float(state.get("best_model_score"))
    if score is None or not state.get("best_model_path"):
        return ResumedBest(moved, None, "")
    target = Path(dirpath) / BEST_FILE
    epoch, step = state.get("best_epoch"), state.get("best_step")
    if state.get("dirpath") in (None, dirpath) and target.is_file() and epoch is not None and step is not None:
        # the folder it was written in, which Lightning trusts as it is: the state says where its best was reached
        return ResumedBest(moved, BestFile(target, score, int(epoch), int(step), None), "")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".best-from-store-", dir=target.parent) as scratch:
        fetch_here = lambda run_id: fetch(run_id, Path(scratch))  # noqa: E731
        return _restore_best(state, moved, score, target, state_key, resumed_step, fetch_here, resumed_file)


def _restore_best(
    state: Mapping[str, Any],
    moved: dict[str, Any],
    score: float,
    target: Path,
    state_key: str,
    resumed_step: int | None,
    fetch: Callable[[str], Path | None],
    resumed_file: str | None = None,
) -> ResumedBest:
    """``restore_best`` once the state has a best value: the first file that holds it, else an earlier best."""
    dirpath = str(target.parent)
    old_dir = Path(str(state.get("dirpath") or dirpath))
    older: tuple[BestFile, str, bool] | None = None  # a consistent earlier best, when the state's own is nowhere

    def candidates() -> Any:
        yield target, "", False
        old_file = Path(str(state["best_model_path"]))
        if old_file.resolve() != target.resolve():
            yield old_file, f"copied from {old_file}", False
        if resumed_file and resumed_step is not None and state.get("best_step") == resumed_step:
            yield Path(resumed_file), f"copied from {resumed_file}", False
        downloaded = fetch(old_dir.name)  # the folder is <checkpoints_dir>/<experiment>/<run id>
        if downloaded is not None:
            yield downloaded, "fetched from the store", True

    for path, origin, move in candidates():
        found = read_best_file(path, state_key)
        if found is None:
            continue
        if same_value(found.score, score):
            note = "" if path == target else install(path, target, move)
            at = {"best_epoch": found.epoch, "best_step": found.step}
            kept = BestFile(target, found.score, found.epoch, found.step, None)
            return ResumedBest({**moved, **at}, kept, origin + note)
        before = found.step is not None and (resumed_step is None or found.step <= resumed_step)
        if older is None and found.state is not None and found.score is not None and before and path != target:
            older = (found, origin, move)
    if older is not None:  # e.g. the store missed the last upload of best.ckpt before a hard kill
        found, origin, move = older
        note = install(found.path, target, move)
        lost = f"the run's best, {score:.4g}, is in no file this run can reach"
        at = {"best_epoch": found.epoch, "best_step": found.step}
        return ResumedBest(
            {**repointed(found.state or {}, dirpath), **at},
            BestFile(target, found.score, found.epoch, found.step, None),
            f"{origin}{note}; {lost}",
        )
    kept = {k: v for k, v in moved.items() if k not in ("best_model_score", "best_k_models", "kth_best_model_path")}
    dropped = {**kept, "best_model_score": None, "best_model_path": "", "best_k_models": {}, "kth_best_model_path": ""}
    for key in ("kth_value", "best_epoch", "best_step"):
        dropped.pop(key, None)
    why = (
        f"its best ({score:.4g}) is not in {target.parent}, {old_dir} or the tracking store, so best.ckpt "
        "restarts from this resume"
    )
    return ResumedBest(dropped, None, why)


def fetch_from_store(tracking_uri: str, run_id: str, into: Path) -> Path | None:
    """A copy of run ``run_id``'s artifact ``checkpoints/best.ckpt`` (found by its old id when ``recipes sync``
    recreated the run) downloaded into ``into``; ``None`` when the store has no such run or file, or does not
    answer, or the file is above the download limit (``fetched.download_checked``; then with one warning)."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR  # noqa: PLC0415
    from recipes.tracking.recreated_runs import current_run_id  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    try:
        found = current_run_id(client, run_id)
        if found is None:
            return None
        artifact = f"{CHECKPOINT_ARTIFACT_DIR}/{BEST_FILE}"
        listed = {a.path: a for a in client.list_artifacts(found, CHECKPOINT_ARTIFACT_DIR)}
        if artifact not in listed:
            return None
        return download_checked(client, found, artifact, listed[artifact].file_size, into, f"run:{run_id}/best")
    except CheckpointError as err:  # above the download limit: said, and the best restarts without that file
        warnings.warn(str(err).replace("nothing was downloaded", "the resumed run's best.ckpt was not downloaded"),
                      stacklevel=2)
        return None
    except (MlflowException, OSError):
        return None


def describe_resume(
    run_id: str,
    epoch: int | None,
    step: int | None,
    given: str | None,
    monitor: str | None,
    best: ResumedBest | None,
) -> str:
    """The line a resumed fit prints: where it continues from and which best it keeps (epochs counted from 1, as
    the epoch lines print them)."""
    where = f"epoch {epoch + 1}" if epoch is not None else "epoch ?"
    if step is not None:
        where += f", step {step}"
    line = f"recipes: resuming run {run_id} from {where}" + (f" ({given})" if given else "")
    if best is None:
        return line
    if best.file is None:
        return f"{line}; best so far: none" + (f" ({best.origin})" if best.origin else "")
    shown = best.file.path
    try:
        shown = shown.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    best_epoch = f"epoch {best.file.epoch + 1}" if best.file.epoch is not None else "epoch ?"
    value = f"{monitor} {best.file.score:.4g}" if best.file.score is not None else str(monitor)
    origin = f", {best.origin}" if best.origin else ""
    return f"{line}; best so far: {best_epoch}, {value} ({shown}{origin})"
