"""What ``--ckpt_path best`` and ``--ckpt_path last`` choose among the tracked fit runs of an experiment.

* The candidates are the experiment's fit runs in the tracking store (MLflow, tag ``loopwise.stage=fit``), whoever
  ran them and wherever: a run's checkpoint is taken from ``<checkpoints_dir>/<experiment>/<run id>/`` when this
  directory trained it, else from the run's uploaded artifact ``checkpoints/<alias>.ckpt``, fetched into
  ``<checkpoints_dir>/.fetched/<run id>/`` (``recipes.checkpoints.fetched``). Runs whose files are not here are
  ranked by what the store says about their uploaded file (the tags ``loopwise.<alias>.*`` written at upload:
  ``recipes.tracking.checkpoint_facts``); only the chosen one is fetched, then read and checked like a local file
  (a run without those tags, uploaded by ``recipes sync`` or an older loopwise, is fetched to be read). The tags are
  not trusted over the files: a ``best`` value that the run's logged history does not back (``history_backs``: a tag
  changed after the upload) has its file fetched and read, and a fetched file whose facts disagree with its tags is
  ranked by the file, with one warning naming the tags.
* ``best``: among the FINISHED fit runs, the ``best.ckpt`` with the best value of the metric it was chosen by (its
  ``RunCheckpoint``'s monitor and mode, read from the file or its tags).
* ``last``: the newest ``last.ckpt`` among the experiment's fit runs, whatever their status (FINISHED, KILLED, and the
  FAILED or still RUNNING runs a crash or a hard kill leaves: resuming those is what ``last`` is for).
* Only tracked runs are candidates: smoke runs (``fast_dev_run``, ``configs/trainer/debug.yaml``: no MLflow run)
  never become ``best`` or ``last``. Candidates whose data differ from this run's (a source whose content digest
  differs, another seed, split, ...: ``recipes.checkpoints.data_guard``) are skipped, and the choice says so.
* A candidate file that cannot be read (truncated, not a checkpoint) is never skipped silently: it might be the one
  that should win (the better run's ``best.ckpt``, the newer run's ``last.ckpt``), so ``best`` (any damaged
  ``best.ckpt``) and ``last`` (a damaged ``last.ckpt`` newer than the chosen one) refuse with the file, the reason,
  and how to choose instead (``--ckpt_path run:<id>/...`` or the file path); so does a chosen run whose uploaded
  copy is damaged or missing.
* The choice names the run, who ran it on which machine (``mlflow.user``, ``loopwise.host``), the epoch and value.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recipes.checkpoints.data_guard import DATA_KEY, DataChange, data_changes
from recipes.checkpoints.fetched import fetch_checkpoint
from recipes.checkpoints.files import CheckpointError, load_checkpoint_weights_only
from recipes.checkpoints.history_rank import (
    CommandMetric,
    MetricHistory,
    data_skips,
    history_backs,
    rank_best,
    skip_text,
)
from recipes.tracking.checkpoint_facts import CheckpointFacts, disagreements, facts_from_tags, facts_of, who_ran
from recipes.tracking.database_urls import masked_url
from recipes.tracking.sqlite_store import sqlite_database_path


@dataclass(frozen=True)
class StoreRun:
    """A fit run as the store lists it: its id, tags and times (``info``: MLflow's ``Run``, ``None`` for a run
    known by id only, whose checkpoints are looked for in this directory alone)."""

    run_id: str
    tags: Mapping[str, str] = field(default_factory=dict)
    start_time: int | None = None
    end_time: int | None = None
    mlflow_run: Any = field(repr=False, default=None)


@dataclass(frozen=True)
class Candidate:
    """One tracked fit run's checkpoint, with what it says about itself (``path`` ``None``: not here, its facts
    are the store's tags until it is fetched)."""

    run_id: str
    path: Path | None
    epoch: int | None
    monitor: str | None
    mode: str | None
    score: float | None
    changes: list[DataChange]
    checkpoint: Any = field(repr=False, default=None)  # the loaded (memory-mapped) file, for the checks after
    time_ms: float | None = None  # when the file was saved (``last`` takes the newest)
    who: str = ""  # user@host that ran it
    origin: str = ""  # "" (this directory's file), "fetched from the store", "the store's copy, cached"
    step: int | None = None  # the global step it was saved at (a run's history is read there)


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
    time_ms: float | None = None


def read_candidate(run_id: str, path: Path, alias: str, data_now: Mapping[str, Any] | None) -> Candidate | Unreadable:
    """What a run's checkpoint file says: epoch, the monitored metric and its best value (``best.ckpt``), and how its
    data settings differ from ``data_now``; ``Unreadable`` (with the reason) when it is not a readable checkpoint."""
    saved_ms = path.stat().st_mtime * 1000 if path.exists() else None
    try:
        ckpt = load_checkpoint_weights_only(path)
    except CheckpointError as err:
        return Unreadable(run_id, path, str(err).removeprefix(f"--ckpt_path {path}: "), saved_ms)
    if not isinstance(ckpt, dict):
        return Unreadable(run_id, path, f"it holds a {type(ckpt).__name__}, not a Lightning checkpoint", saved_ms)
    facts = facts_of(ckpt, alias)
    saved = ckpt.get("datamodule_hyper_parameters")
    content = ckpt.get(DATA_KEY)  # the source's content digest: the same bytes elsewhere are the same data
    changes = (data_changes(saved if isinstance(saved, dict) else None, data_now, content=content)
               if data_now is not None else [])
    return Candidate(run_id, path, facts.epoch, facts.monitor, facts.mode, facts.score, changes, ckpt, saved_ms,
                     step=facts.step)


def epoch_text(candidate: Candidate) -> str:
    """``epoch N`` counted from 1, as the epoch lines of a run print it."""
    return "epoch ?" if candidate.epoch is None else f"epoch {candidate.epoch + 1}"


def origin_text(candidate: Candidate) -> str:
    """``, by user@host`` and where the file came from, for the printed choice."""
    by = f", by {candidate.who}" if candidate.who else ""
    return f"{by}, {candidate.origin}" if candidate.origin else by


def describe_run_file(run_id: str, path: Path, alias: str, tags: Mapping[str, str], origin: str) -> tuple[str, Any]:
    """``run <id>, epoch N, <monitor> <value>, by user@host, <origin>`` for one run's checkpoint file, and the
    loaded file (``("", None)`` when it cannot be read)."""
    found = read_candidate(run_id, path, alias, None)
    if isinstance(found, Unreadable):
        return "", None
    found = replace(found, who=who_ran(dict(tags)), origin=origin)
    value = f", {found.monitor} {found.score:.4g}" if found.monitor and found.score is not None else ""
    return f"run {run_id}, {epoch_text(found)}{value}{origin_text(found)}", found.checkpoint


def tracked_fit_runs(experiment: str, tracking_uri: str, statuses: tuple[str, ...] | None) -> list[StoreRun]:
    """The experiment's fit runs in the store (newest first), of the given statuses (``None``: any). A SQLite store
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
    return [StoreRun(r.info.run_id, dict(r.data.tags), r.info.start_time, r.info.end_time, r)
            for r in runs if statuses is None or r.info.status in statuses]


class StoreCopies:
    """Fetches runs' uploaded checkpoints into the cache, with one MLflow client made when first needed."""

    def __init__(self, tracking_uri: str, root: str | Path, alias: str, data_now: Mapping[str, Any] | None) -> None:
        self.tracking_uri, self.root, self.alias, self.data_now = tracking_uri, root, alias, data_now
        self._client: Any = None

    def read(self, run: StoreRun) -> Candidate | Unreadable:
        """Fetch (or take from the cache) the run's ``<alias>.ckpt`` and read it (``FileNotFoundError``: none)."""
        if self._client is None:
            from mlflow.tracking import MlflowClient  # noqa: PLC0415

            self._client = MlflowClient(self.tracking_uri)
        fetched = fetch_checkpoint(self._client, run.mlflow_run, self.alias, self.root, self.alias)
        candidate = read_candidate(run.run_id, fetched.path, self.alias, self.data_now)
        if isinstance(candidate, Unreadable):
            return replace(candidate, reason=f"the store's copy (checkpoints/{self.alias}.ckpt) is damaged: "
                                             f"{candidate.reason}")
        origin = "fetched from the store" if fetched.downloaded else "the store's copy, cached"
        facts = facts_from_tags(dict(run.tags), self.alias)
        if facts is not None:  # the file wins over its upload's tags; a disagreement is said once
            own = CheckpointFacts(candidate.epoch, candidate.step, candidate.monitor, candidate.mode, candidate.score)
            found = disagreements(facts, own, self.alias, dict(run.tags))
            if found:
                warnings.warn(
                    f"--ckpt_path {self.alias}: run {run.run_id}'s tags disagree with its {self.alias}.ckpt in the "
                    f"store ({'; '.join(found)}): it is ranked by what the file says (tags changed after the upload, "
                    "or written for another version of the file)",
                    stacklevel=2,
                )
        saved = facts.time_ms if facts is not None and facts.time_ms is not None else run.end_time or run.start_time
        return replace(candidate, who=who_ran(dict(run.tags)), origin=origin, time_ms=saved)


def store_candidate(
    run: StoreRun, alias: str, copies: StoreCopies, history: MetricHistory | None = None
) -> Candidate | Unreadable | None:
    """A run whose file is not here: its facts from its upload tags (fetched later, if chosen), or, for a run
    uploaded without them, its fetched file; ``None`` when the store holds no such checkpoint for it. A ``best``
    value that the run's logged history (``history``) does not back is not trusted: the file is fetched and read
    (``history_backs``), so a changed tag can neither demote nor promote a run."""
    facts = facts_from_tags(dict(run.tags), alias)
    unbacked = (facts is not None and alias == "best" and history is not None and facts.scored
                and not history_backs(history, run.run_id, str(facts.monitor), facts.mode, float(facts.score or 0.0),
                                      facts.step))
    if facts is None or unbacked:
        try:
            return copies.read(run)
        except FileNotFoundError:
            return None  # never uploaded (log_model: false, a run that ended before its first checkpoint)
    saved = facts.time_ms if facts.time_ms is not None else run.end_time or run.start_time
    return Candidate(run.run_id, None, facts.epoch, facts.monitor, facts.mode, facts.score, [], None, saved,
                     who_ran(dict(run.tags)), step=facts.step)


def choose_checkpoint(
    alias: str,
    experiment: str,
    root: str | Path,
    tracking_uri: str,
    data_now: Mapping[str, Any] | None,
    runs: Callable[[str, str, tuple[str, ...] | None], list[StoreRun | str]] = tracked_fit_runs,
    metric: CommandMetric | None = None,
) -> Choice:
    """Resolve ``best`` or ``last`` (see the module docstring). ``data_now`` is this run's data ``init_args``
    (``None``: do not compare); ``metric`` the command's own metric, which ``best`` ranks by
    (``recipes.checkpoints.history_rank``; ``None``: the newest run's). Raises ``FileNotFoundError`` naming what was
    looked for and what was skipped."""
    statuses = ("FINISHED",) if alias == "best" else None
    history = MetricHistory(tracking_uri)
    base = Path(root) / experiment
    copies = StoreCopies(tracking_uri, root, alias, data_now)
    candidates: list[Candidate] = []
    skipped: list[Candidate] = []
    unreadable: list[Unreadable] = []
    stores: dict[str, StoreRun] = {}
    for run in runs(experiment, tracking_uri, statuses):
        run = StoreRun(run) if isinstance(run, str) else run
        stores[run.run_id] = run
        path = base / run.run_id / f"{alias}.ckpt"
        if path.is_file():
            found: Candidate | Unreadable | None = read_candidate(run.run_id, path, alias, data_now)
            if isinstance(found, Candidate):
                found = replace(found, who=who_ran(dict(run.tags)))
        elif run.mlflow_run is not None:
            found = store_candidate(run, alias, copies, history)
        else:
            found = None
        if isinstance(found, Unreadable):
            unreadable.append(found)
        elif found is not None:
            (skipped if found.changes else candidates).append(found)
    while True:
        listed = {run_id: history for run_id, run in stores.items() if run.mlflow_run is not None}
        chosen, described = pick(alias, experiment, base, tracking_uri, candidates, skipped, unreadable,
                                 metric, listed)
        if chosen.path is not None:
            return Choice(str(chosen.path.resolve()), chosen.run_id, described, chosen.checkpoint)
        # ranked by the store's tags: fetch it, and rank again with what the file itself says
        read = copies.read(stores[chosen.run_id])
        candidates.remove(chosen)
        if isinstance(read, Unreadable):
            raise FileNotFoundError(
                f"--ckpt_path {alias}: by what the store records of its upload the choice is {described}, but "
                f"{read.reason}; it is not skipped for another run: upload "
                f"it again (`recipes sync` in the directory that trained it) or choose a checkpoint yourself "
                f"(--ckpt_path run:<run id>/{alias} or a file path)"
            )
        (skipped if read.changes else candidates).append(read)


def pick(
    alias: str, experiment: str, base: Path, tracking_uri: str, candidates: list[Candidate], skipped: list[Candidate],
    unreadable: list[Unreadable], metric: CommandMetric | None = None,
    histories: Mapping[str, MetricHistory] | None = None,
) -> tuple[Candidate, str]:
    """The candidate ``best``/``last`` chooses now and its description; raises ``FileNotFoundError`` when there is
    none, or when a damaged file might have won (``refuse_unreadable``). ``best`` ranks by ``metric`` (``histories``:
    where each run the store lists has its logged metrics)."""
    skip_note = skip_text(data_skips(skipped))
    looked = f"under {base.resolve()} or uploaded to {masked_url(tracking_uri)}"
    if alias == "last":
        if not candidates:
            refuse_unreadable(alias, unreadable, None)
            raise FileNotFoundError(
                f"--ckpt_path last: no last.ckpt for experiment {experiment!r} among its tracked fit runs {looked}"
                f"{skip_note}; run `recipes fit` first or give a checkpoint file"
            )
        newest = max(candidates, key=lambda c: c.time_ms or 0.0)
        refuse_unreadable(alias, [u for u in unreadable if (u.time_ms or 0.0) > (newest.time_ms or 0.0)], newest)
        return newest, f"run {newest.run_id}, {epoch_text(newest)}{origin_text(newest)}{skip_note}"
    by, ranked, skips = rank_best(candidates, metric, histories or {})
    skip_note = skip_text(data_skips(skipped) + skips)
    if not ranked:
        refuse_unreadable(alias, unreadable, None)
        if by is not None:  # best.ckpt files, none with a value of the command's metric
            raise FileNotFoundError(
                f"--ckpt_path best: no best.ckpt of experiment {experiment!r} {looked} can be ranked by {by.monitor}"
                f"{skip_note}; choose one yourself (--ckpt_path run:<run id>/best or a file path), or rank by the "
                "metric they were chosen by (--model.init_args.monitor <metric>)"
            )
        raise FileNotFoundError(
            f"--ckpt_path best: no best.ckpt for experiment {experiment!r} among its FINISHED fit runs {looked}"
            f"{skip_note}; run `recipes fit` to the end first (smoke runs are not tracked) or give a checkpoint file"
        )
    assert by is not None
    sign = 1.0 if by.mode == "max" else -1.0
    best, rank = max(ranked, key=lambda r: sign * float(r[1].value or 0.0))  # ties: the newest (max keeps the first)
    refuse_unreadable(alias, unreadable, best)
    value = f"{by.monitor} {rank.value:.4g}"
    if rank.from_history:
        value += f" (from its history at {epoch_text(best)}; its best.ckpt was chosen by {rank.chosen_by})"
    from_history = sum(r.from_history for _, r in ranked)
    notes = f", {from_history} ranked by their {by.monitor} history" if from_history else ""
    notes += "" if metric is not None else f", by the newest run's {by.monitor}: this command's task names no monitor"
    return best, (
        f"run {best.run_id}, {epoch_text(best)}, {value} (best of {len(ranked)} finished fit run(s){notes}"
        f"{skip_note}){origin_text(best)}"
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


__all__ = ["Candidate", "Choice", "StoreRun", "Unreadable", "choose_checkpoint", "describe_run_file", "read_candidate",
           "refuse_unreadable", "tracked_fit_runs"]
