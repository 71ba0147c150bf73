"""``--ckpt_path best`` by the command's own metric: what each candidate run is ranked by, and the runs left out.

* The command's metric is the monitor of its task after the config and the command line (``--model.init_args.monitor``,
  else the task class's ``default_monitor``) and its mode (``monitor_mode``, else "min" for losses and errors, "max"
  for scores): ``command_metric``. A task that names no monitor gives none: ``best`` then compares the runs that
  monitor the newest run's metric, as before, and says so.
* A run whose ``best.ckpt`` was chosen by that metric is ranked by the value its file records. A run whose
  ``best.ckpt`` was chosen by another metric is ranked by the command's metric AS THAT RUN LOGGED IT when the file was
  saved: the value in the run's MLflow history (``MlflowClient.get_metric_history``) at the step of the validation
  that saved the file (found in the history of the metric that chose it: its newest log of the file's value at or
  before the file's global step). Without such a value the run is skipped, and the message says so.
* ``skip_text``: each run left out and why (other data, another metric without that history, no value recorded,
  history that cannot be read), grouped by reason: the first 5 named, then "and N more".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from typing import Any, Literal

from lightning_modules.recipe_contract import default_monitor_of
from lightning_modules.task import Task

SHOWN_SKIPS = 5  # runs named in a message; the others are counted


@dataclass(frozen=True)
class CommandMetric:
    """The metric ``best`` ranks by: the command's task monitor and its direction."""

    monitor: str
    mode: Literal["min", "max"]


def command_metric(task_class: Any, monitor: str | None, mode: str | None) -> CommandMetric | None:
    """The metric of a command whose task is ``task_class`` with the config's ``monitor`` and ``monitor_mode``
    (``None`` where the config sets none): the given monitor, else the class's ``default_monitor``; the given mode,
    else the one the task gives that metric. ``None`` when the task names no monitor (a plain ``LightningModule``)."""
    name = monitor or default_monitor_of(task_class, None)
    if not name:
        return None
    direction = mode if mode in ("min", "max") else Task.mode_for(str(name))
    return CommandMetric(str(name), "max" if direction == "max" else "min")


@dataclass(frozen=True)
class Skip:
    """A run ``best``/``last`` left out: ``why`` (the group it is counted in) and ``detail`` (this run's part)."""

    run_id: str
    why: str
    detail: str = ""


def skip_text(skips: list[Skip]) -> str:
    """``; skipped N run(s) <why> (run <id>: <detail>; ...)`` for each reason, in the order met; at most
    ``SHOWN_SKIPS`` runs are named in all, the others of each reason counted as ``and N more``."""
    groups: dict[str, list[Skip]] = {}
    for skip in skips:
        groups.setdefault(skip.why, []).append(skip)
    room, parts = SHOWN_SKIPS, []
    for why, members in groups.items():
        named = [f"run {s.run_id}: {s.detail}" if s.detail else f"run {s.run_id}" for s in members[:room]]
        hidden = len(members) - len(named)
        room -= len(named)
        listed = "; ".join(named + ([f"and {hidden} more"] if hidden else []))
        parts.append(f"; skipped {len(members)} run(s) {why} ({listed})")
    return "".join(parts)


@dataclass(frozen=True)
class Ranking:
    """What a candidate is ranked by: ``value`` of the command's metric at its ``best.ckpt``, ``from_history``
    when that value was read from the run's history (its file was chosen by ``chosen_by``), else ``skip``."""

    value: float | None
    from_history: bool = False
    chosen_by: str = ""
    skip: Skip | None = None


class MetricHistory:
    """The command's metric as each run logged it, read from the tracking store with one MLflow client made when
    first needed (each run's history read once)."""

    def __init__(self, tracking_uri: str) -> None:
        self.tracking_uri = tracking_uri
        self._client: Any = None
        self._histories: dict[tuple[str, str], list[Any]] = {}

    def history(self, run_id: str, key: str) -> list[Any]:
        """The run's logged values of ``key`` (MLflow ``Metric``s); raises ``MlflowException``/``OSError``."""
        if (run_id, key) not in self._histories:
            if self._client is None:
                from mlflow.tracking import MlflowClient  # noqa: PLC0415

                self._client = MlflowClient(self.tracking_uri)
            self._histories[run_id, key] = list(self._client.get_metric_history(run_id, key))
        return self._histories[run_id, key]

    def value_at(self, run_id: str, key: str, chosen_by: str, score: float, epoch: int | None,
                 step: int | None) -> float | None:
        """``key`` as the run logged it with the validation that saved its ``best.ckpt``: that validation is found in
        the history of ``chosen_by``, the metric the file was chosen by, as its newest log of ``score`` at or before
        the file's global ``step`` (Lightning logs a validation's metrics one step before the step its checkpoint
        records; a file without its step: in its ``epoch``, by the run's ``epoch`` metric), and ``key`` is read at
        that step. ``None`` when either is not there."""
        found = [m for m in self.history(run_id, chosen_by) if m.value is not None
                 and math.isclose(m.value, score, rel_tol=1e-6, abs_tol=1e-12)]
        if step is not None:
            found = [m for m in found if m.step <= step]
        elif epoch is not None:
            in_epoch = {m.step for m in self.history(run_id, "epoch") if m.value == epoch}
            found = [m for m in found if m.step in in_epoch]
        else:
            return None
        if not found:
            return None
        saved = max(m.step for m in found)
        logged = [m for m in self.history(run_id, key) if m.step == saved and m.value is not None
                  and not math.isnan(m.value)]
        return float(max(logged, key=lambda m: m.timestamp).value) if logged else None


def history_backs(history: MetricHistory, run_id: str, monitor: str, mode: str | None, score: float,
                  step: int | None) -> bool:
    """Whether the run's logged history of ``monitor`` backs a ``best.ckpt`` value ``score`` that the store's tags
    record (saved at global ``step``): the best logged value (by ``mode``) at or before that step is ``score``. A
    tag changed after the upload, or written for another file, is not backed: its file is read instead (a history
    that cannot be read backs nothing)."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    try:
        logged = [m for m in history.history(run_id, monitor) if m.value is not None and not math.isnan(m.value)
                  and (step is None or m.step <= step)]
    except (MlflowException, OSError):
        return False
    if not logged:
        return False
    best = max(m.value for m in logged) if mode == "max" else min(m.value for m in logged)
    return math.isclose(best, score, rel_tol=1e-6, abs_tol=1e-12)


def ranking(
    run_id: str, monitor: str, score: float, epoch: int | None, step: int | None, metric: CommandMetric,
    history: MetricHistory | None,
) -> Ranking:
    """How a ``best.ckpt`` chosen by ``monitor`` (value ``score``, saved at ``epoch``/``step``) ranks by ``metric``:
    its own value when it was chosen by that metric, else the run's logged value of it then (``history``: the store;
    ``None`` for a run the store does not list), else a ``Skip`` saying why."""
    if monitor == metric.monitor:
        return Ranking(score)
    why = f"whose best.ckpt was chosen by another metric, with no {metric.monitor} in their history at that step"
    where = f"epoch {epoch + 1}" if epoch is not None else "its step"
    if history is None:
        return Ranking(None, skip=Skip(run_id, why, f"chosen by {monitor}; the store holds no history of this run"))
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    try:
        value = history.value_at(run_id, metric.monitor, monitor, score, epoch, step)
    except (MlflowException, OSError) as err:
        detail = str(err).splitlines()[0] if str(err) else type(err).__name__
        return Ranking(None, skip=Skip(run_id, f"whose {metric.monitor} history could not be read", detail))
    if value is None:
        return Ranking(None, skip=Skip(run_id, why, f"chosen by {monitor}; no {metric.monitor} logged at {where}"))
    return Ranking(value, from_history=True, chosen_by=monitor)


def data_skips(skipped: Sequence[Any]) -> list[Skip]:
    """The candidates (``choice.Candidate``) trained on other data as skipped runs: each setting that differs, with
    both values."""
    return [Skip(c.run_id, "trained on other data", ", ".join(f"{d.name} {d.trained!r} vs {d.now!r}"
                                                             for d in c.changes)) for c in skipped]


def rank_best(
    candidates: Sequence[Any], metric: CommandMetric | None, histories: Mapping[str, MetricHistory],
) -> tuple[CommandMetric | None, list[tuple[Any, Ranking]], list[Skip]]:
    """The metric ``best`` ranks by (the command's; without one the newest run's; ``None`` when no candidate records a
    value), each candidate (``choice.Candidate``, newest first) it can rank with its ``Ranking``, and the ones it
    cannot, as skipped runs. ``histories``: where each run the store lists has its logged metrics."""
    skips: list[Skip] = []
    scored = []
    for c in candidates:
        if c.monitor is None or c.score is None or math.isnan(c.score):
            skips.append(Skip(c.run_id, "whose best.ckpt records no value of a monitored metric",
                              f"{c.monitor} {c.score}" if c.monitor else ""))
        else:
            scored.append(c)
    if not scored:
        return None, [], skips
    if metric is None:  # the task names no monitor: the newest run's metric decides which runs compare
        by = CommandMetric(str(scored[0].monitor), "max" if scored[0].mode == "max" else "min")
        why = f"monitoring another metric than the newest run's {by.monitor}"
        skips += [Skip(c.run_id, why, f"{c.monitor} ({c.mode})") for c in scored if (c.monitor, c.mode) != astuple(by)]
        return by, [(c, Ranking(c.score)) for c in scored if (c.monitor, c.mode) == astuple(by)], skips
    ranked = []
    for c in scored:
        rank = ranking(c.run_id, str(c.monitor), float(c.score), c.epoch, c.step, metric, histories.get(c.run_id))
        if rank.skip is not None:
            skips.append(rank.skip)
        else:
            ranked.append((c, rank))
    return metric, ranked, skips


__all__ = ["CommandMetric", "MetricHistory", "Ranking", "SHOWN_SKIPS", "Skip", "command_metric", "data_skips",
           "history_backs", "rank_best", "ranking", "skip_text"]
