"""What a checkpoint file says about itself (epoch, step, the metric its ``best.ckpt`` was chosen by and its value),
and the same facts as run tags, written when the file reaches the store.

``RecipeLogger`` tags a run each time one of its checkpoints is uploaded (``loopwise.best.epoch``,
``loopwise.best.step``, ``loopwise.best.monitor``, ``loopwise.best.mode``, ``loopwise.best.value``,
``loopwise.best.time``; the same under ``loopwise.last.``), read from the very file that was sent. ``--ckpt_path
best|last`` in a directory without the run's files ranks the team's runs by these tags and fetches only the one it
chooses (``recipes.checkpoints.choice``), instead of downloading every run's checkpoint to read it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipes.tracking.abandoned_runs import HOST_TAG  # the machine that writes the run

FACT_NAMES = ("epoch", "step", "monitor", "mode", "value", "time")  # each a tag loopwise.<alias>.<name>
USER_TAG = "mlflow.user"  # set by MLflow's context providers when the run is created


@dataclass(frozen=True)
class CheckpointFacts:
    """A checkpoint's epoch (from 0), global step, monitored metric, mode and best value, and when it was saved (ms;
    ``None`` where unknown)."""

    epoch: int | None = None
    step: int | None = None
    monitor: str | None = None
    mode: str | None = None
    score: float | None = None
    time_ms: int | None = None

    @property
    def scored(self) -> bool:
        """Whether it names a metric and a value that can be compared."""
        return self.monitor is not None and self.score is not None and not math.isnan(self.score)


def facts_of(ckpt: Any, alias: str) -> CheckpointFacts:
    """The facts of a loaded checkpoint (``torch.load`` of a Lightning checkpoint): the epoch and step it was saved
    at and, from the state of its ``RunCheckpoint(alias=...)`` callback, the monitored metric, mode and best value."""
    if not isinstance(ckpt, dict):
        return CheckpointFacts()
    monitor = mode = score = None
    for key, state in (ckpt.get("callbacks") or {}).items():
        if isinstance(state, dict) and f"'alias': '{alias}'" in str(key) and state.get("monitor"):
            monitor = str(state["monitor"])
            mode = "max" if "'mode': 'max'" in str(key) else "min"
            value = state.get("best_model_score")
            score = float(value) if value is not None else None
    epoch, step = ckpt.get("epoch"), ckpt.get("global_step")
    return CheckpointFacts(int(epoch) if epoch is not None else None, int(step) if step is not None else None,
                           monitor, mode, score)


#: ``loopwise.<alias>.counting``: the numbering of the tags beside it. "messages" (this version): the epoch counted
#: from 1, as the progress lines show it; the step of a file chosen by a metric (``best``) is the global step at which
#: that metric value was logged (one before the checkpoint's: Lightning logs an epoch's validation at the step of its
#: last batch), of any other (``last``) the checkpoint's global step (``loopwise.checkpoint_step``). Tags without it
#: (earlier versions) hold the checkpoint's own numbers: the epoch from 0, the checkpoint's global step.
COUNTING, MESSAGES = "counting", "messages"


def facts_tags(facts: CheckpointFacts, alias: str) -> dict[str, str]:
    """``{"loopwise.<alias>.<fact>": text}`` for the facts that are known, numbered as the messages show them
    (``COUNTING``)."""
    step = facts.step
    if step is not None and facts.monitor is not None:
        step = max(step - 1, 0)  # the step its metric value was logged at
    values = {"epoch": None if facts.epoch is None else facts.epoch + 1, "step": step, "monitor": facts.monitor,
              "mode": facts.mode, "value": None if facts.score is None else repr(facts.score), "time": facts.time_ms,
              COUNTING: MESSAGES}
    return {f"loopwise.{alias}.{name}": str(value) for name, value in values.items() if value is not None}


def facts_from_tags(tags: dict[str, str], alias: str) -> CheckpointFacts | None:
    """The facts a run's tags record for its uploaded ``<alias>.ckpt`` (``None``: no upload was tagged), in the
    checkpoint's own numbers (epoch from 0, the checkpoint's global step) whichever version wrote the tags."""
    found = {name: tags.get(f"loopwise.{alias}.{name}") for name in FACT_NAMES}
    if found["time"] is None and found["step"] is None:
        return None

    def number(text: str | None, kind: type) -> Any:
        try:
            return kind(text) if text is not None else None
        except ValueError:
            return None

    epoch, step = number(found["epoch"], int), number(found["step"], int)
    if tags.get(f"loopwise.{alias}.{COUNTING}") == MESSAGES:
        epoch = None if epoch is None else epoch - 1
        if step is not None and found["monitor"] is not None:
            step += 1  # the checkpoint's, one after its metric value's
    return CheckpointFacts(epoch, step, found["monitor"], found["mode"], number(found["value"], float),
                           number(found["time"], int))


def disagreements(tagged: CheckpointFacts, read: CheckpointFacts, alias: str, tags: dict[str, str]) -> list[str]:
    """``"loopwise.<alias>.<fact> <tag's text> vs the file's <value>"`` for each fact a ``best``/``last`` choice ranks
    by (the metric, its mode and value) that the run's ``tags`` record (``tagged``, as ``facts_from_tags`` read them)
    otherwise than the file itself says (``read``); empty when they agree. The epoch, step and time are not compared
    (their tags' conventions changed between versions, and a fetched file's own time is when it was fetched)."""
    found = []
    pairs = {"monitor": (tagged.monitor, read.monitor), "mode": (tagged.mode, read.mode),
             "value": (tagged.score, read.score)}
    for name, (tag, own) in pairs.items():
        key = f"loopwise.{alias}.{name}"
        if key not in tags or own is None:
            continue
        same = (tag == own if name != "value" else
                tag is not None and (math.isclose(tag, own, rel_tol=1e-6, abs_tol=1e-12)
                                     or (math.isnan(tag) and math.isnan(own))))
        if not same:
            shown = f"{own:.4g}" if name == "value" else str(own)
            found.append(f"{key} {tags[key]} vs the file's {shown}")
    return found


def checkpoint_tags(facts: CheckpointFacts, alias: str, local_file: str | Path) -> dict[str, str]:
    """The tags for ``local_file`` uploaded as the run's ``<alias>.ckpt``: its ``facts`` (taken from the checkpoint
    dict when it was written: the file is not read again) and the file's modification time."""
    saved = int(os.stat(local_file).st_mtime * 1000)
    return facts_tags(CheckpointFacts(facts.epoch, facts.step, facts.monitor, facts.mode, facts.score, saved), alias)


class FileFacts:
    """What each checkpoint file of a run holds, kept by the logger until the file is uploaded: ``dumped`` is told the
    checkpoint dict being written (``RunContinuity.on_save_checkpoint``), ``saved`` the callback whose file it became
    (Lightning's ``after_save_checkpoint``), ``run_tags`` gives the tags of an uploaded version."""

    def __init__(self) -> None:
        self._dumped: dict[str, CheckpointFacts] | None = None
        self._files: dict[str, tuple[tuple[int, int, int], dict[str, str]]] = {}  # name -> (file version, tags)

    def dumped(self, checkpoint: dict[str, Any]) -> None:
        """The checkpoint dict being written now."""
        self._dumped = {name: facts_of(checkpoint, name) for name in ("best", "last")}

    def saved(self, artifact_files: dict[str, str]) -> None:
        """``{name: file}`` of the callback that just wrote its file: a file whose version is new holds the dict."""
        for name, path in artifact_files.items():
            if self._dumped is None or not path or not os.path.isfile(path):
                continue
            version = os.stat(path)
            identity = (version.st_ino, version.st_size, version.st_mtime_ns)  # uploads.file_identity
            if self._files.get(name, (None,))[0] != identity:
                self._files[name] = (identity, checkpoint_tags(self._dumped.get(name, CheckpointFacts()), name, path))

    def run_tags(self, name: str, identity: tuple[int, int, int]) -> list[Any]:
        """MLflow ``RunTag``s of version ``identity`` of ``name`` (none when it is not the version whose facts are
        known)."""
        from mlflow.entities import RunTag  # noqa: PLC0415

        version, tags = self._files.get(name, (None, {}))
        return [RunTag(key, value) for key, value in tags.items()] if version == identity else []


def who_ran(tags: dict[str, str]) -> str:
    """``user@host`` of a run (MLflow's ``mlflow.user``, loopwise's ``loopwise.host``); what is known of it."""
    user, host = tags.get(USER_TAG, ""), tags.get(HOST_TAG, "")
    return f"{user}@{host}" if user and host else user or (f"@{host}" if host else "")


__all__ = ["CheckpointFacts", "disagreements", "facts_from_tags", "FileFacts", "facts_of", "facts_tags",
           "checkpoint_tags", "who_ran"]
