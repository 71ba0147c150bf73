"""What the end of a run writes to its store, kept beside its journal when the store is down, and written by the replay.

A run whose store fails before it ends (a deleted or read-only ``mlflow.db``, a server that stopped) still makes its
end-of-run records; the store just cannot take them. They are kept in the run's folder and journaled, so that the
replay of the journal (``recipes sync``, the next command that reads the store, a server that answers again) writes
them as the end of the run would have:

* a figure (the confusion matrix) is saved as ``<run folder>/artifacts/<name>`` and journaled as an "artifact" entry;
  the replay logs the file as the run's artifact ``<name>`` when the run lacks it;
* the MLflow model is saved as an MLflow model folder ``<run folder>/model/`` (the pyfunc, its signature, input
  example and checkpoint, as ``tracked_run.log_pyfunc_model`` saves it) and journaled as a "model" entry (name, the
  monitored metric and best value whose step the model links to, its tags, the registered model name, the run tag
  that names its URI); the replay creates the logged model of the run (``logged_model.log_logged_model``) from the
  folder, its ``MLmodel`` given the new model's ids, sets the URI tag and registers it when asked, unless the run's
  URI tag is set already;
* who ran it: MLflow's context tags (``mlflow.user``, ``mlflow.source.*``) are journaled with the run's first tags
  (``context_tags``), so a run ``recipes sync`` recreates in a new store names its user, not the one running the sync.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

ARTIFACTS_DIR = "artifacts"  # <run folder>/artifacts/<name>: the files the store did not take
MODEL_DIR = "model"  # <run folder>/model: the MLflow model the store did not take


def context_tags(tags: dict[str, Any] | None) -> dict[str, str]:
    """``tags`` with MLflow's context tags of this process (``mlflow.user``, ``mlflow.source.*``) that MLflow adds when
    it creates a run: the journal's first entry, so that a recreated run keeps them."""
    from mlflow.tracking.context.registry import resolve_tags  # noqa: PLC0415

    context = {key: str(value) for key, value in resolve_tags().items()
               if key == "mlflow.user" or key.startswith("mlflow.source.")}
    return {**context, **{key: str(value) for key, value in (tags or {}).items()}}


def keep_figure(logger: Any, figure: Any, artifact_file: str) -> bool:
    """Save ``figure`` in the run's folder and journal it (the store is down); ``False`` when the run keeps no
    journal."""
    journal = logger.journal_path() if callable(getattr(logger, "journal_path", None)) else None
    if journal is None:
        return False
    target = journal.parent / ARTIFACTS_DIR / artifact_file
    target.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(target)
    logger.record("artifact", name=artifact_file, file=f"{ARTIFACTS_DIR}/{artifact_file}")
    return True


def keep_model(logger: Any, save: Any, entry: dict[str, Any]) -> Path | None:
    """Save the MLflow model in the run's folder with ``save(path, mlflow_model)`` and journal ``entry`` (``name``,
    ``best``, ``tags``, ``registered_model_name``, ``uri_tag``) for the replay; the folder, or ``None`` when the run
    keeps no journal."""
    from mlflow.models import Model  # noqa: PLC0415

    journal = logger.journal_path() if callable(getattr(logger, "journal_path", None)) else None
    if journal is None:
        return None
    folder = journal.parent / MODEL_DIR
    shutil.rmtree(folder, ignore_errors=True)  # an earlier attempt's: this one's model replaces it
    save(str(folder), Model(run_id=str(logger.run_id)))
    logger.record("model", path=MODEL_DIR, **entry)
    return folder


def replay_end_of_run(entries: list[dict[str, Any]], client: Any, run_id: str, folder: Path | None) -> int:
    """Write into run ``run_id`` the journaled "artifact" and "model" entries (files in ``folder``, the run's folder)
    it lacks; how many were written. Without ``folder`` (a journal read from elsewhere) nothing is written."""
    if folder is None or not entries:
        return 0
    held = {a.path for a in client.list_artifacts(run_id)}
    tags, written = dict(client.get_run(run_id).data.tags), 0
    inside = folder.resolve()
    for entry in entries:
        source = folder / str(entry.get("file") or entry.get("path") or "")
        if not source.resolve().is_relative_to(inside) or source.resolve() == inside:
            continue  # a journal names files of its own run folder only (a damaged or edited line names no other)
        if entry.get("kind") == "artifact" and entry.get("name") not in held and source.is_file():
            name = str(entry["name"])
            client.log_artifact(run_id, str(source), str(Path(name).parent) if Path(name).parent.name else None)
            held.add(name)
            written += 1
        elif entry.get("kind") == "model" and source.is_dir() and str(entry.get("uri_tag")) not in tags:
            tags[str(entry["uri_tag"])] = log_kept_model(client, run_id, source, entry)
            written += 1
    return written


def log_kept_model(client: Any, run_id: str, source: Path, entry: dict[str, Any]) -> str:
    """Log the model folder ``source`` as the run's logged model (``entry``: see ``keep_model``), link it to the step
    of its best value (else the run's last step), set the run's URI tag, register it when asked; its URI."""
    from mlflow.models import Model  # noqa: PLC0415

    from recipes.tracking.logged_model import (  # noqa: PLC0415
        MODEL_URI_PREFIX, best_step, last_step, log_logged_model, register_logged_model,
    )

    best, step = entry.get("best"), None
    if isinstance(best, list) and len(best) == 2:
        step = best_step(client, run_id, str(best[0]), float(best[1]))
    step = last_step(client, run_id) if step is None else step

    def save(path: str, mlflow_model: Any) -> None:  # the kept folder, its MLmodel naming the new logged model
        shutil.copytree(source, path)
        kept = Model.load(path)
        kept.run_id, kept.model_id, kept.model_uuid = run_id, mlflow_model.model_id, mlflow_model.model_uuid
        kept.artifact_path = mlflow_model.artifact_path
        kept.save(str(Path(path) / "MLmodel"))

    model_id = log_logged_model(client, run_id, str(entry["name"]) if entry.get("name") else None, step,
                                {str(k): str(v) for k, v in (entry.get("tags") or {}).items()}, save)
    uri = f"{MODEL_URI_PREFIX}{model_id}"
    client.set_tag(run_id, str(entry["uri_tag"]), uri)
    if entry.get("registered_model_name"):
        register_logged_model(client, str(entry["registered_model_name"]), model_id, run_id)
    return uri


__all__ = ["context_tags", "keep_figure", "keep_model", "replay_end_of_run"]
