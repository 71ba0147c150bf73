"""A run that ``recipes sync`` recreated in a new store keeps its files reachable.

MLflow gives every run it creates a new id (no client call creates a run under a chosen id), so a run whose store
was deleted comes back from its journal under a new id, tagged ``loopwise.replayed_from_run = <old id>``. Its files
stay where they were, ``<checkpoints_dir>/<experiment>/<old id>/``, and:

* ``<checkpoints_dir>/<experiment>/<new id>`` becomes a link to that folder, so ``best``, ``last``,
  ``run:<new id>/...``, a resume's checkpoints and journal (which go to ``<experiment>/<run id>/``) all find the same
  files under either id;
* ``current_run_id`` maps the old id to the new one: a checkpoint stamped with the old id resumes the recreated run,
  and ``mlflow:<old id>/best|last`` fetches its artifacts;
* the run's artifacts are uploaded from the local files: ``checkpoints/best.ckpt`` and ``checkpoints/last.ckpt``
  from the folder (``checkpoint_upload.upload_missing_checkpoints``: its ledger holds no upload to the new id), and
  whatever else the old run's artifact folder still holds locally (``./mlruns/<experiment
  id>/<old id>/artifacts``: ``config.yaml``, the logged ``model/``, figures); ``config.yaml`` also comes from the
  journal when that folder is gone;
* tag values naming the old id (``loopwise.model_uri = runs:/<old id>/model``) are replayed naming the new id
  (``tracking_journal.replay``'s ``origin``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recipes.tracking.sqlite_store import sqlite_database_path

REPLAYED_FROM_TAG = "loopwise.replayed_from_run"
CHECKPOINT_ARTIFACT_DIR = "checkpoints"


def current_run_id(client: Any, run_id: str) -> str | None:
    """``run_id`` when the store holds that run, else the id of the run ``recipes sync`` recreated from it, else
    ``None``."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415

    try:
        return client.get_run(run_id).info.run_id
    except MlflowException:
        pass
    try:
        found = runs_recreated_from(client, [e.experiment_id for e in client.search_experiments()], run_id)
    except MlflowException:
        return None
    return found[0].info.run_id if found else None


def filter_value(text: str) -> str | None:
    """``text`` as a string value of an MLflow search filter: in single quotes, in double quotes when it holds a
    single quote (a folder named ``team's run``); ``None`` when it holds both (MLflow's filter has no escape)."""
    for quote in ("'", '"'):
        if quote not in text:
            return f"{quote}{text}{quote}"
    return None


def runs_recreated_from(client: Any, experiment_ids: list[str], old_id: str) -> list[Any]:
    """The runs of ``experiment_ids`` that ``recipes sync`` recreated from run ``old_id`` (none for a text no filter
    can quote: no run id holds both quotes)."""
    value = filter_value(old_id)
    if value is None or not experiment_ids:
        return []
    return client.search_runs(experiment_ids, f"tags.`{REPLAYED_FROM_TAG}` = {value}")


def local_artifact_folders(tracking_uri: str, run_id: str) -> list[Path]:
    """The local artifact folders (``mlruns/<experiment id>/<run_id>/artifacts``) a run of an embedded store left
    beside the store or in the working directory."""
    roots = {Path.cwd() / "mlruns"}
    database = sqlite_database_path(tracking_uri)
    if database is not None:
        roots.add(database.parent / "mlruns")
    return [folder for root in sorted(roots) for folder in sorted(root.glob(f"*/{run_id}/artifacts")) if folder.is_dir()]


def link_run_folder(folder: Path, new_id: str) -> str | None:
    """Make ``<experiment folder>/<new_id>`` a link to the run's ``folder``; a line saying why not, else ``None``."""
    link = folder.parent / new_id
    if link.exists() or link.is_symlink():
        return None if link.resolve() == folder.resolve() else f"{link} exists and is not a link to {folder.name}"
    try:
        link.symlink_to(folder.name, target_is_directory=True)
    except OSError as err:
        return f"could not link {link} to {folder.name} ({err}): use run:{folder.name}/last for its checkpoints"
    return None


def upload_run_files(client: Any, tracking_uri: str, old_id: str, new_id: str) -> list[str]:
    """Upload to run ``new_id`` the local files of the run ``old_id`` it was recreated from (see the module
    docstring) that it lacks; what was uploaded, by artifact path."""
    held = {a.path for a in client.list_artifacts(new_id)}
    uploaded = []
    for local in local_artifact_folders(tracking_uri, old_id):
        for item in sorted(local.iterdir()):
            # checkpoints come from the run's folder, newer than any upload (``upload_missing_checkpoints``)
            if item.name in held or item.name == CHECKPOINT_ARTIFACT_DIR:
                continue
            if item.is_dir():
                client.log_artifacts(new_id, str(item), item.name)
            else:
                client.log_artifact(new_id, str(item))
            held.add(item.name)
            uploaded.append(item.name)
    return uploaded


def restore_recreated_run(client: Any, tracking_uri: str, folder: Path, new_id: str) -> str:
    """Keep the files of the run in ``folder`` (named by its old id) reachable from the recreated run ``new_id``;
    a short description of what was done, for ``recipes sync``'s line."""
    old_id = folder.name
    problem = link_run_folder(folder, new_id)
    uploaded = upload_run_files(client, tracking_uri, old_id, new_id)
    parts = [f"files in {folder}" + (f" ({problem})" if problem else f", also as {new_id}")]
    if uploaded:
        parts.append("uploaded " + ", ".join(uploaded))
    return "; ".join(parts)


__all__ = ["REPLAYED_FROM_TAG", "current_run_id", "filter_value", "restore_recreated_run", "runs_recreated_from"]
