"""What ``--ckpt_path best`` and ``--ckpt_path last`` choose among the tracked fit runs of an experiment.

* ``best``: among the FINISHED fit runs of the experiment (MLflow, tag ``loopwise.stage=fit``), the ``best.ckpt``
  with the best value of the metric it was chosen by (its ``RunCheckpoint``'s monitor and mode, read from the file).
* ``last``: the newest ``last.ckpt`` among the experiment's fit runs, whatever their status (FINISHED, KILLED, and the
  FAILED or still RUNNING runs a crash or a hard kill leaves: resuming those is what ``last`` is for).
* Only tracked runs are candidates: smoke runs (``fast_dev_run``, ``configs/trainer/debug.yaml``: no MLflow run)
  never become ``best`` or ``last``. Candidates whose data settings differ from this run's (another seed, split,
  file, ...) are skipped, and the choice says so.
* A candidate file that cannot be read (truncated, not a checkpoint) is never skipped silently: it might be the one
  that should win (the better run's ``best.ckpt``, the newer run's ``last.ckpt``), so ``best`` (any damaged
  ``best.ckpt``) and ``last`` (a damaged ``last.ckpt`` newer than the chosen one) refuse with the file, the reason,
  and how to choose instead (``--ckpt_path run:<id>/...`` or the file path).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipes.checkpoints.files import CheckpointError, load_checkpoint_weights_only
from recipes.checkpoints.data_guard import DataChange, data_changes
from recipes.tracking.sqlite_store import sqlite_database_path


@dataclass(frozen=True)
class Candidate:
    """One tracked fit run's checkpoint file, with what it says about itself."""

    run_id: str
    path: Path
    epoch: int | None
    monitor: str | None
    mode: str | None
    score: float | None
    changes: list[DataChange]
    checkpoint: Any = field(repr=False, default=None)  # the loaded (memory-mapped) file, for the checks after


@dataclass(frozen=True)
class Choice:
    """The checkpoint that ``best``/``last`` resolved to, and why."""

    path: str
    run_id: str
    description: str
    checkpoint: Any = field(repr=False, default=None)  # the loaded (memory-mapped) file: not read a second time


@dataclass(frozen=True)
class Unreadable:
    """A candidate's checkpoint file that could not be read, and why."""

    run_id: str
    path: Path
    reason: str


def read_candidate(run_id: str, path: Path, alias: str, data_now: Mapping[str, Any] | None) -> Candidate | Unreadable:
    """What a run's checkpoint file says: epoch, the monitored metric and its best value (``best.ckpt``), and how its
    data settings differ from ``data_now``; ``Unreadable`` (with the reason) when it is not a readable checkpoint."""
    try:
        ckpt = load_checkpoint_weights_only(path)
    except CheckpointError as err:
        return Unreadable(run_id, path, str(err).removeprefix(f"--ckpt_path {path}: "))
    if not isinstance(ckpt, dict):
        return Unreadable(run_id, path, f"it holds a {type(ckpt).__name__}, not a Lightning checkpoint")
    monitor = mode = score = None
    for key, state in (ckpt.get("callbacks") or {}).items():
        if isinstance(state, dict) and f"'alias': '{alias}'" in str(key) and state.get("monitor"):
            monitor = str(state["monitor"])
            mode = "max" if "'mode': 'max'" in str(key) else "min"
            value = state.get("best_model_score")
            score = float(value) if value is not None else None
    saved = ckpt.get("datamodule_hyper_parameters")
    changes = data_changes(saved if isinstance(saved, dict) else None, data_now or {}) if data_now is not None else []
    epoch = ckpt.get("epoch")
    return Candidate(run_id, path, int(epoch) if epoch is not None else None, monitor, mode, score, changes, ckpt)


def epoch_text(candidate: Candidate) -> str:
    """``epoch N`` counted from 1, as the epoch lines of a run print it."""
    return "epoch ?" if candidate.epoch is None else f"epoch {candidate.epoch + 1}"


def tracked_fit_runs(experiment: str, tracking_uri: str, statuses: tuple[str, ...] | None) -> list[str]:
    """Run ids of the experiment's fit runs (newest first), of the given statuses (``None``: any). A SQLite store
    that does not exist yet holds none (and is not created here, outside ``prepare_sqlite_store``'s lock)."""
    database = sqlite_database_path(tracking_uri)
    if database is not None and not database.is_file():
        return []
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri)
    try:
        found = client.get_experiment_by_name(experiment)
        if found is None:
            return []
        runs = client.search_runs(
            [found.experiment_id], "tags.`loopwise.stage` = 'fit'", order_by=["attributes.start_time DESC"]
        )
    except MlflowException:
        return []
    return [r.info.run_id for r in runs if statuses is None or r.info.status in statuses]


def choose_checkpoint(
    alias: str,
    experiment: str,
    root: str | Path,
    tracking_uri: str,
    data_now: Mapping[str, Any] | None,
    runs: Callable[[str, str, tuple[str, ...] | None], list[str]] = tracked_fit_runs,
) -> Choice:
    """Resolve ``best`` or ``last`` (see the module docstring). ``data_now`` is this run's data ``init_args``
    (``None``: do not compare). Raises ``FileNotFoundError`` naming what was looked for and what was skipped."""
    statuses = ("FINISHED",) if alias == "best" else None
    base = Path(root) / experiment
    candidates, skipped, unreadable = [], [], []
    for run_id in runs(experiment, tracking_uri, statuses):
        path = base / run_id / f"{alias}.ckpt"
        if not path.is_file():
            continue
        candidate = read_candidate(run_id, path, alias, data_now)
        if isinstance(candidate, Unreadable):
            unreadable.append(candidate)
            continue
        (skipped if candidate.changes else candidates).append(candidate)
    skip_note = ""
    if skipped:
        first = skipped[0]
        shown = "; ".join(f"{c.name} {c.trained!r} vs {c.now!r}" for c in first.changes)
        skip_note = f"; skipped {len(skipped)} run(s) trained on other data (run {first.run_id}: {shown})"
    if alias == "last":
        if not candidates:
            refuse_unreadable(alias, unreadable, None)
            raise FileNotFoundError(
                f"--ckpt_path last: no last.ckpt for experiment {experiment!r} among its tracked fit runs under "
                f"{base.resolve()}{skip_note}; run `recipes fit` first or give a checkpoint file"
            )
        newest = max(candidates, key=lambda c: c.path.stat().st_mtime)
        refuse_unreadable(alias, [u for u in unreadable if u.path.stat().st_mtime > newest.path.stat().st_mtime],
                          newest)
        described = f"run {newest.run_id}, {epoch_text(newest)}{skip_note}"
        return Choice(str(newest.path.resolve()), newest.run_id, described, newest.checkpoint)
    scored = [c for c in candidates if c.monitor is not None and c.score is not None and not math.isnan(c.score)]
    if not scored:
        refuse_unreadable(alias, unreadable, None)
        raise FileNotFoundError(
            f"--ckpt_path best: no best.ckpt for experiment {experiment!r} among its FINISHED fit runs under "
            f"{base.resolve()}{skip_note}; run `recipes fit` to the end first (smoke runs are not tracked) or give "
            "a checkpoint file"
        )
    reference = scored[0]  # the newest run's metric decides which runs compare
    comparable = [c for c in scored if (c.monitor, c.mode) == (reference.monitor, reference.mode)]
    sign = 1.0 if reference.mode == "max" else -1.0
    best = max(comparable, key=lambda c: sign * float(c.score))  # ties: the newest (max keeps the first)
    refuse_unreadable(alias, unreadable, best)
    others = "" if len(comparable) == len(scored) else f"; {len(scored) - len(comparable)} monitor another metric"
    return Choice(
        str(best.path.resolve()),
        best.run_id,
        f"run {best.run_id}, {epoch_text(best)}, {best.monitor} {best.score:.4g} (best of {len(comparable)} finished "
        f"fit run(s){others}{skip_note})",
        best.checkpoint,
    )


def refuse_unreadable(alias: str, unreadable: list[Unreadable], chosen: Candidate | None) -> None:
    """A damaged file that might have won stops the choice (``FileNotFoundError``): the file, why it cannot be read,
    and the ways to choose instead."""
    if not unreadable:
        return
    first = unreadable[0]
    more = ""
    if len(unreadable) > 1:
        more = f" (and {len(unreadable) - 1} more: {', '.join(str(u.path.resolve()) for u in unreadable[1:])})"
    why = "its run may be the best" if alias == "best" else "it is newer than every last.ckpt that can be read"
    instead = f"run:{chosen.run_id if chosen is not None else '<run id>'}/{alias}"
    raise FileNotFoundError(
        f"--ckpt_path {alias}: cannot read {first.path.resolve()} (run {first.run_id}): {first.reason}{more}; {why}, "
        f"so it is not skipped: move or repair it, or choose a checkpoint yourself (--ckpt_path {instead} or a "
        "file path)"
    )


__all__ = ["Candidate", "Choice", "Unreadable", "choose_checkpoint", "read_candidate", "refuse_unreadable",
           "tracked_fit_runs"]
