"""Where a recipe's checkpoints live: ``<checkpoints_dir>/<experiment>/<run id>/{best,last}.ckpt``, and what
``--ckpt_path best|last|run:<run id>/best|last|mlflow:<run id>/best|last|<file>`` points at."""

from __future__ import annotations

import re
import tempfile
from datetime import datetime
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.checkpoints.choice import choose_checkpoint, describe_run_file
from recipes.checkpoints.fetched import check_download_size, download_checked, fetch_checkpoint
from recipes.checkpoints.files import CheckpointError, run_stamp
from recipes.checkpoints.history_rank import CommandMetric
from recipes.checkpoints.run_stamp import RESUMED_FROM_TAG
from recipes.tracking.sqlite_store import sqlite_database_path
from recipes.tracking.database_urls import masked_url
from recipes.tracking.recreated_runs import REPLAYED_FROM_TAG, current_run_id
from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR
from recipes.tracking.pending_replay import replay_before_reading
from recipes.tracking.uris import default_tracking_uri

MLFLOW_REF = re.compile(r"^mlflow:(?P<run_id>[^/\s]+)/(?P<alias>best|last)$")
RUN_REF = re.compile(r"^run:(?P<run_id>[^/\s]+)/(?P<alias>best|last)$")
UNTRAINED = "none"
ALIASES = ("best", "last")  # the run's two checkpoint files, best.ckpt and last.ckpt (``RunCheckpoint``)
"""``--ckpt_path none``: validate/test/predict the network as built (no checkpoint), on purpose."""
EVALUATIONS = ("validate", "test", "predict")
CHECKPOINT_CHOICES = "--ckpt_path best|last|run:<id>/best|last|mlflow:<id>/best|last|<file>"


def evaluates_as_built(stage: str, ckpt_path: str | None, init_from: Any) -> bool:
    """Whether ``stage`` runs with no checkpoint at all: ``validate``/``test``/``predict`` with ``--ckpt_path none``.

    Raises ``ValueError`` (one line) for an evaluation with neither ``--ckpt_path`` nor the task's ``init_from``:
    it would score weights nobody trained; and for ``none`` given to ``fit`` or in another case (``None``)."""
    if ckpt_path is not None and str(ckpt_path).lower() == UNTRAINED:
        if stage not in EVALUATIONS:
            raise ValueError(f"--ckpt_path {ckpt_path}: only validate, test and predict take it; {stage} without "
                             "--ckpt_path starts from the network as built")
        if str(ckpt_path) != UNTRAINED:
            raise ValueError(f"--ckpt_path {ckpt_path}: write --ckpt_path {UNTRAINED} (lower case) to evaluate the "
                             "untrained network on purpose")
        return True
    if stage in EVALUATIONS and not ckpt_path and not init_from:
        raise ValueError(f"{stage} without --ckpt_path would evaluate a network nobody trained: pass "
                         f"{CHECKPOINT_CHOICES}, or --ckpt_path {UNTRAINED} to evaluate the untrained network on "
                         "purpose")
    return False


def download_run_checkpoint(run_id: str, alias: str, root: str | Path, tracking_uri: str | None = None) -> str:
    """Download ``checkpoints/<alias>.ckpt`` of an MLflow run to a fresh directory.

    The file lands in ``<root>/<experiment>/<run_id>/downloaded/<alias>-<random>/checkpoints/<alias>.ckpt``, a new
    directory every time, so it never overwrites a file (nor the run's own ``best.ckpt``/``last.ckpt``).
    Raises ``FileNotFoundError`` when the run or the artifact does not exist, ``CheckpointError`` when it is larger
    than the download limit (``fetched.check_download_size``, before anything is fetched). The old id of a run that
    ``recipes sync`` recreated names the recreated run.
    """
    from mlflow.exceptions import MlflowException  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    uri = tracking_uri or default_tracking_uri()
    ref = f"--ckpt_path mlflow:{run_id}/{alias}"
    client = MlflowClient(uri)
    run_id = current_run_id(client, run_id) or run_id  # a run `recipes sync` recreated is found by its old id
    try:
        run = client.get_run(run_id)
    except MlflowException as err:
        raise FileNotFoundError(f"{ref}: no MLflow run {run_id!r} in {masked_url(uri)}") from err
    artifact = f"{CHECKPOINT_ARTIFACT_DIR}/{alias}.ckpt"
    listed = {a.path: a for a in client.list_artifacts(run_id, CHECKPOINT_ARTIFACT_DIR)}
    present = set(listed)
    if artifact not in present:
        has = ", ".join(sorted(present)) or "no checkpoints"
        raise FileNotFoundError(f"{ref}: run {run_id} has no artifact {artifact} ({has})")
    experiment = client.get_experiment(run.info.experiment_id)
    name = experiment.name if experiment is not None else "unknown"
    base = Path(root) / name / run_id / "downloaded"
    check_download_size(listed[artifact].file_size, artifact, run_id, ref.removeprefix("--ckpt_path "), base)
    base.mkdir(parents=True, exist_ok=True)
    target = tempfile.mkdtemp(prefix=f"{alias}-{datetime.now().strftime('%Y%m%d-%H%M%S')}-", dir=base)
    try:
        local = download_checked(client, run_id, artifact, listed[artifact].file_size, Path(target),
                                 ref.removeprefix("--ckpt_path "))
    except (MlflowException, OSError) as err:
        raise FileNotFoundError(f"{ref}: could not download {artifact}: {err}") from err
    return str(Path(local).resolve())


@dataclass(frozen=True)
class ResolvedCheckpoint:
    """The file a ``--ckpt_path`` reference names, and its content when resolving it read the file already."""

    path: str
    loaded: Any = None


def store_client(tracking_uri: str | None) -> Any:
    """An MLflow client of the tracking store (``MLFLOW_TRACKING_URI`` or ``./mlflow.db`` by default)."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    return MlflowClient(tracking_uri or default_tracking_uri())


def store_run(run_id: str, tracking_uri: str | None) -> Any:
    """The MLflow ``Run`` of ``run_id`` (a run `recipes sync` recreated is found by its old id); ``None`` when the
    store does not hold it or cannot be read (a local file is used without it)."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    uri = tracking_uri or default_tracking_uri()
    database = sqlite_database_path(uri)
    if database is not None and not database.is_file():
        return None
    client = store_client(uri)
    try:
        return client.get_run(current_run_id(client, run_id) or run_id)
    except (MlflowException, OSError):
        return None


def described(
    reference: str, run_id: str, path: Path, alias: str, run: Any, origin: str, option: str = "--ckpt_path",
    tracking_uri: str | None = None,
) -> ResolvedCheckpoint:
    """Print what ``reference`` (``run:``/``mlflow:``) loads: the run, who ran it where, the epoch and value, where the
    file came from (rank 0); the file is read once here and handed on (a file that cannot be read is left to the
    checks that follow, which name the problem). A file stamped by another run is refused (``check_stamp``)."""
    tags = dict(run.data.tags) if run is not None else {}
    text, loaded = describe_run_file(run_id, path, alias, tags, origin)
    check_stamp(reference, run_id, path, alias, loaded, run, tracking_uri, option)
    if text and rank_zero_only.rank == 0:
        print(f"recipes: {option} {reference} = {path.resolve()} ({text})", flush=True)
    return ResolvedCheckpoint(str(path.resolve()), loaded)


def own_run_ids(run_id: str, run: Any, tracking_uri: str | None, limit: int = 50) -> set[str]:
    """The ids whose stamp a checkpoint of run ``run_id`` (``run``: its MLflow ``Run``, ``None`` when the store does
    not hold it) may carry: the run's (as asked, and its id in the store), the old id of a run ``recipes sync``
    recreated, and every run it branched from (``loopwise.resumed_from_run``: a branch keeps its source run's
    ``best.ckpt`` until it saves a better one), followed back through the store."""
    ids = {run_id}
    while run is not None and len(ids) < limit:
        tags = run.data.tags
        ids.update(i for i in (run.info.run_id, tags.get(REPLAYED_FROM_TAG)) if i)
        source = tags.get(RESUMED_FROM_TAG)
        if not source or source in ids:
            break
        ids.add(source)
        run = store_run(source, tracking_uri)
    return ids


def check_stamp(
    reference: str, run_id: str, path: Path, alias: str, loaded: Any, run: Any, tracking_uri: str | None,
    option: str = "--ckpt_path",
) -> None:
    """``run:<id>/...`` and ``mlflow:<id>/...`` load run ``run_id``'s checkpoint: a file whose run stamp names
    another run (one copied into this run's folder, or uploaded as its artifact) is refused with a
    ``CheckpointError`` naming both runs, before any run is continued or changed (``fit`` would otherwise continue
    the stamped run, not the one asked for). A file without a stamp, or that cannot be read (the checks after name
    the problem), is left as it is; a run's folder that is a link to the folder of the run's old id (``recipes
    sync``) is that run's."""
    stamped = run_stamp(loaded).get("mlflow_run_id") if isinstance(loaded, dict) else None
    if not stamped or stamped in own_run_ids(run_id, run, tracking_uri) or Path(path).resolve().parent.name == stamped:
        return
    found = store_run(stamped, tracking_uri) if run is not None else None
    if found is not None and found.info.run_id == run.info.run_id:
        return  # the stamp is the old id of this run, recreated by `recipes sync`
    raise CheckpointError(
        f"{option} {reference}: {Path(path).resolve()} was written by run {stamped}, not by run {run_id} (copied "
        f"into run {run_id}'s checkpoints?); refused, so that neither run's record changes: to use run {stamped}'s "
        f"checkpoint give --ckpt_path run:{stamped}/{alias} or the file's path, else put run {run_id}'s own "
        f"{alias}.ckpt back"
    )


def resolve_checkpoint(
    ckpt_path: str,
    experiment: str,
    root: str | Path,
    tracking_uri: str | None = None,
    data_now: Mapping[str, Any] | None = None,
    metric: CommandMetric | None = None,
    option: str = "--ckpt_path",
) -> ResolvedCheckpoint:
    """Turn a ``--ckpt_path`` reference into a checkpoint file and check that it exists:

    * ``best`` / ``last``: chosen among the experiment's fit runs in the tracking store (``choice``; candidates
      whose data settings differ from ``data_now`` are skipped; files not here fetched into
      ``<root>/.fetched/<run id>/``); ``best`` ranks them by ``metric``, the command's own (``history_rank``;
      ``None``: the newest run's); the choice is printed.
    * ``run:<run id>/best|last``: that run's local file, else its uploaded copy fetched into the same cache;
      ``mlflow:<run id>/best|last``: a downloaded copy of that run's checkpoint artifact; both print the run, who ran
      it where, the epoch and value. Anything else: a file path.

    ``option`` names the setting in what is printed (``init_from`` for a task's initial weights). Raises
    ``FileNotFoundError`` naming what was looked for. A reference to the store first replays the run journals
    under ``root`` that the store may lack (``recipes.tracking.pending_replay``; rank 0).
    """
    if rank_zero_only.rank == 0 and (ckpt_path in ALIASES or ckpt_path.startswith(("run:", "mlflow:"))):
        replay_before_reading(tracking_uri or default_tracking_uri(), root, "recipes")
    ref = MLFLOW_REF.match(ckpt_path)
    if ref is not None:
        path = Path(download_run_checkpoint(ref["run_id"], ref["alias"], root, tracking_uri))
        run = store_run(ref["run_id"], tracking_uri)
        return described(ckpt_path, ref["run_id"], path, ref["alias"], run, "downloaded from the store", option,
                         tracking_uri)
    if ckpt_path.startswith("mlflow:"):
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: expected mlflow:<run id>/best or mlflow:<run id>/last")
    ref = RUN_REF.match(ckpt_path)
    if ref is not None:
        path = Path(root) / experiment / ref["run_id"] / f"{ref['alias']}.ckpt"
        run = store_run(ref["run_id"], tracking_uri)
        origin = ""
        if not path.is_file():
            if run is None:
                raise FileNotFoundError(
                    f"--ckpt_path {ckpt_path}: no {path.resolve()} (a run of experiment {experiment!r} under "
                    f"{Path(root).resolve()}) and no run {ref['run_id']!r} in {masked_url(tracking_uri or default_tracking_uri())}"
                )
            fetched = fetch_checkpoint(store_client(tracking_uri), run, ref["alias"], root, ckpt_path)
            path, origin = fetched.path, "fetched from the store" if fetched.downloaded else "the store's copy, cached"
        return described(ckpt_path, ref["run_id"], path, ref["alias"], run, origin, option, tracking_uri)
    if ckpt_path.startswith("run:"):
        raise FileNotFoundError(f"--ckpt_path {ckpt_path}: expected run:<run id>/best or run:<run id>/last")
    if ckpt_path in ALIASES:
        choice = choose_checkpoint(ckpt_path, experiment, root, tracking_uri or default_tracking_uri(), data_now,
                                   metric=metric)
        if rank_zero_only.rank == 0:
            print(f"recipes: --ckpt_path {ckpt_path} = {choice.path} ({choice.description})", flush=True)
        return ResolvedCheckpoint(choice.path, choice.checkpoint)
    path = Path(ckpt_path)
    if not path.is_file():
        raise FileNotFoundError(f"--ckpt_path: checkpoint file not found: {path.resolve()}")
    return ResolvedCheckpoint(str(path.resolve()))
