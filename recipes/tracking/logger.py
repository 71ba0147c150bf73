"""MLflow tracking: the embedded SQLite default, or a server named by MLFLOW_TRACKING_URI."""

from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from recipes.compat.internals import (
    mlflow_logger_experiment_name, mlflow_logger_forget_checkpoints, mlflow_logger_log_model,
    mlflow_logger_run_created, mlflow_logger_uploaded_files,
)
from recipes.tracking.uploads import LEDGER_NAME, CheckpointUploader, UploadLedger, file_identity
from recipes.tracking.checkpoint_facts import FileFacts
from recipes.tracking.write_behind import WriteBehind
from recipes.tracking.pending_replay import mark_replayed
from recipes.tracking.catch_up import ServerCatchUp
from recipes.tracking.failures import (  # noqa: F401  (fast_http_failures, short_reason: used from here too)
    bound_http_requests, fast_http_failures, is_read_only, is_server_uri, read_only_at_start, short_reason,
    store_failure_message, warn_store_failure, watch_store_failures,
)
from recipes.tracking.journal import JOURNAL_NAME, TrackingJournal, read_journal, replay
from recipes.tracking.uris import default_tracking_uri
from recipes.tracking.experiment_kind import mark_experiment_kind
from recipes.tracking.sqlite_store import ensure_experiment
from recipes.tracking.end_of_run import context_tags

CHECKPOINT_ARTIFACT_DIR = "checkpoints"


class RecipeLogger(MLFlowLogger):
    """Lightning's MLflow logger with loopwise defaults.

    The tracking URI is resolved when the logger is built (``MLFLOW_TRACKING_URI``, else an SQLite file
    ``mlflow.db`` in the working directory with artifacts under ``./mlruns``). Checkpoints are logged as run
    artifacts under fixed names, ``checkpoints/best.ckpt`` and ``checkpoints/last.ckpt``.

    Under DDP only global rank 0 talks to MLflow (one run): ``experiment`` is Lightning's ``rank_zero_experiment``
    (a no-op object on other ranks, where ``run_id`` stays ``None`` unless given), and the methods below that write
    to the run are ``rank_zero_only``.

    Args:
        experiment_name: MLflow experiment; default: the recipe's file stem.
        run_name: MLflow run name; default: ``<experiment>-<first 8 characters of the run id>``, unique and the
            prefix of the id that ``mlflow:<run id>`` takes (MLflow's own random names repeat between runs, since its
            generator follows the seeded ``random`` module).
        tracking_uri: Tracking server or database URI; default: ``MLFLOW_TRACKING_URI`` or ``./mlflow.db``.
        tags: Extra run tags.
        log_model: Upload the best and last checkpoints: ``all`` as they are saved (replacing the previous upload,
            at most once per ``checkpoint_upload_interval``), ``true`` once at the end of the run, ``false`` never.
        run_id: Continue this existing run instead of creating one.
        synchronous: Write every metrics call to the store before it returns (``true``) instead of holding the values
            for up to 5 s and writing them from one background thread (the journal has them at once either way).
        checkpoint_upload_interval: With ``log_model: all``, the least seconds between two uploads of the same
            checkpoint; saves in between are folded into the next upload, and the newest files always go out when
            the run ends. ``0`` uploads at every save.
    """

    def __init__(
        self,
        experiment_name: str | None = None,
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, str] | None = None,
        log_model: Literal[True, False, "all"] = "all",
        run_id: str | None = None,
        synchronous: bool = False,
        checkpoint_upload_interval: float = 30.0,
    ) -> None:
        self.store_uri = tracking_uri or default_tracking_uri()
        bound_http_requests(self.store_uri)  # a call to a server that is gone fails in seconds, not minutes
        super().__init__(
            experiment_name=experiment_name or "loopwise",
            run_name=run_name or f"{experiment_name or 'loopwise'}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S-%f}",
            tracking_uri=self.store_uri,
            tags=dict(tags) if tags else None,
            log_model=log_model,
            run_id=run_id,
            synchronous=True,  # Lightning's own writes (few): at once; the metrics go through ``WriteBehind``
        )
        self._checkpoint_callbacks: dict[str, ModelCheckpoint] = {}
        self._uploader = CheckpointUploader(
            self._upload_file, checkpoint_upload_interval, on_uploaded=self._uploaded, on_failed=self.store_failed
        )
        self._ledger: UploadLedger | None = None  # which checkpoint versions reached the run (recipe fits)
        self._file_facts = FileFacts()  # what each checkpoint file holds, tagged on the run when it is uploaded
        self.resumed = run_id is not None
        self._name_after_id = run_name is None and run_id is None  # renamed <experiment>-<id> once the run exists
        self.killed_by: str | None = None  # the signal that stopped training (``mark_killed``), if any
        self._steps_before_resume: dict[str, set[int]] | None = None  # a continued run's history, read once
        self._journal_dir: Path | None = None  # <checkpoints_dir>/<experiment>: the run's journal goes below
        self._journal: TrackingJournal | None = None
        self.store_failure: str | None = None  # the first write the store refused: from then on, the journal only
        self._failure_lock = threading.Lock()  # the upload thread and MLflow's async writer report failures too
        self._write_lock = threading.RLock()  # journal entries vs the switch back to a server that answers again
        self._catch_up: ServerCatchUp | None = None  # a server that stopped answering: recipes/tracking/catch_up.py
        #: metrics and tags not in the store yet, written by one background thread (recipes/tracking/write_behind.py)
        self.write_behind = WriteBehind(lambda: self.experiment, lambda: self.run_id, lambda: self.store_failure,
                                        self.store_failed, self._write_lock)
        self.synchronous = synchronous  # every call written before it returns: nothing held back
        self._experiment_unchecked = True  # the experiment exists (``ensure_experiment``), checked once
        self._kind_unchecked = True  # the experiment's kind (recipes/tracking/experiment_kind.py), checked once
        watch_store_failures(self)

    @property
    def experiment_name(self) -> str:
        """Name of the MLflow experiment this logger writes to."""
        return mlflow_logger_experiment_name(self)

    @property
    def experiment(self) -> Any:
        """Lightning's MLflow client (rank 0; a no-op object elsewhere), which creates the run on first use; a run
        created with the default name is named ``<experiment>-<short run id>`` at once. A store that is read-only
        when the run would be created is ``TrackingStoreReadOnly`` (one line, before training)."""
        try:
            if self._experiment_unchecked and rank_zero_only.rank == 0 and not mlflow_logger_run_created(self):
                # the experiment made here, with its kind, only now that the run is made: a command that failed
                # before left none empty (and Lightning, finding it, does not warn that it creates it)
                self._experiment_unchecked = False
                ensure_experiment(self.store_uri, self.experiment_name)
            client = super().experiment
        except Exception as err:
            if is_read_only(err):
                raise read_only_at_start(self.store_uri) from None
            raise
        if self._name_after_id and mlflow_logger_run_created(self) and rank_zero_only.rank == 0:
            self._name_after_id = False
            name = f"{self.experiment_name}-{str(self.run_id)[:8]}"
            self.tags = {**(self.tags or {}), "mlflow.runName": name}  # the journal opens with them: named once
            self.add_tags({"mlflow.runName": name})
        if self._kind_unchecked and mlflow_logger_run_created(self) and rank_zero_only.rank == 0:
            self._kind_unchecked = False  # once per logger: a model-development experiment in MLflow's UI
            mark_experiment_kind(client, str(self.experiment_id))
        return client

    def mark_killed(self, reason: str) -> None:
        """Training was stopped from outside (``reason``: "SIGTERM" or "SIGINT"): the run ends KILLED, not FAILED."""
        self.killed_by = reason

    # --- the run's journal: nothing lost when the store fails (recipes/tracking/journal.py) --------------------
    def keep_journal(self, experiment_dir: Path) -> None:
        """Keep the run's record in ``<experiment_dir>/<run id>/tracking-journal.jsonl`` as well (recipe fits)."""
        self._journal_dir = Path(experiment_dir)

    def keeps_journal(self) -> bool:
        """Whether the run's journal is open (a recipe fit is running)."""
        return self._journal is not None

    def journal_path(self) -> Path | None:
        """The open journal's file (``None`` when none is): its folder keeps what the store could not take."""
        return self._journal.path if self._journal is not None else None

    def journal_run_id(self) -> str | None:
        """The id of the run whose journal is open (its folder's name), ``None`` when none is."""
        return path.parent.name if (path := self.journal_path()) is not None else None

    def record(self, kind: str, **data: Any) -> None:
        """Append to the journal (once the run exists and a journal folder was given)."""
        if self._journal_dir is None or not mlflow_logger_run_created(self) or rank_zero_only.rank != 0:
            return
        with self._write_lock:
            if self._journal is None:
                self._journal = TrackingJournal(self._journal_dir / str(self.run_id) / JOURNAL_NAME, str(self.run_id))
                self._ledger = UploadLedger(self._journal_dir / str(self.run_id) / LEDGER_NAME)
                if is_server_uri(self.store_uri):  # caught up with by itself once the server is back
                    self._catch_up = ServerCatchUp(lambda: self.experiment, str(self.run_id), self._journal.path,
                                                   self.store_uri, self._resume_store_writes, self.store_failed)
                self._journal.record("tags", values=context_tags(self.tags))  # mlflow.user: a recreated run's too
            self._journal.record(kind, **data)

    def store_failed(self, error: BaseException | str) -> None:
        """A write the store refused: warn once (``failures``); training goes on, writing only to the journal."""
        with self._failure_lock:
            if self.store_failure is not None:
                return
            self.store_failure = str(error) if isinstance(error, str) else f"{type(error).__name__}: {error}"
        where = self._journal.path if self._journal is not None else "the run's checkpoint folder"
        warn_store_failure(store_failure_message(self.store_uri, error, where, self._catch_up is not None))
        if self._catch_up is not None:
            self._catch_up.start()  # probes the server until it answers, then writes the journal into the run

    def _resume_store_writes(self) -> list[dict[str, Any]]:
        """The server answers again (``ServerCatchUp``): writes go to it again from now on; returns the journal as
        it stands (its metric values are written from it, so the ones held back are dropped)."""
        with self._write_lock:
            self.write_behind.drop()
            self.store_failure = None
            return read_journal(self._journal.path) if self._journal is not None else []

    def replay_journal(self) -> None:
        """A continued run: write what its journal holds and the store lacks (a store that failed last time)."""
        if self._journal_dir is None:
            return
        path = self._journal_dir / str(self.run_id) / JOURNAL_NAME
        if path.is_file():
            replay(read_journal(path), self.experiment, str(self.run_id))

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        """A continued run logs a metric only at steps its history does not hold yet: the attempt that was killed
        may have logged steps after the checkpoint the resume restarts from, and the resume (bit-exact) logs them
        again; MLflow keeps every write, so they would appear twice. A branch skips the steps it copied."""
        if step is not None and (self.resumed or self._steps_before_resume is not None):
            logged = self.steps_before_resume()
            metrics = {k: v for k, v in dict(metrics).items() if step not in logged.get(k, ())}
            if not metrics:
                return
        now = int(time.time() * 1000)  # one time for both: a value written twice is one row (``WriteBehind.add``)
        with self._write_lock:  # in the journal and held, or neither, when writes go back to the server
            self.record("metrics", step=step, time=now, values=dict(metrics))
            self.write_behind.add(dict(metrics), step, now)
        if self.synchronous:
            self.write_behind.send()

    @rank_zero_only
    def hold_tag(self, key: str, value: Any) -> None:
        """Set a run tag the way metrics are written: in the journal at once, in the store with the held metrics
        (a tag written at every checkpoint save, ``loopwise.checkpoint_step``, costs the training thread no MLflow
        call; its readers take the newer of the store's and the journal's)."""
        self.hold_tags({key: value})

    def hold_tags(self, tags: dict[str, Any]) -> None:
        """``hold_tag`` for several tags at once (one journal entry); also called from the upload thread."""
        values = {key: str(value) for key, value in tags.items()}
        with self._write_lock:
            self.record("tags", values=values)
            self.write_behind.add_tags(values)
        if self.synchronous:
            self.write_behind.send()

    def log_history(self, by_step: dict[int, dict[str, float]]) -> None:
        """A branch's copy of the history before its step (``run_continuity.copy_history``): logged, then held like a
        continued run's, so the resumed epoch's train metrics at a copied step are not logged twice."""
        for step in sorted(by_step):
            self.log_metrics(by_step[step], step)
        held = self._steps_before_resume = self._steps_before_resume or {}
        for step, values in by_step.items():
            for key in values:
                held.setdefault(key, set()).add(step)

    def steps_before_resume(self) -> dict[str, set[int]]:
        """The steps of every metric the continued run held when this process started writing to it."""
        if self._steps_before_resume is None:
            client, run_id = self.experiment, self.run_id
            keys = client.get_run(run_id).data.metrics
            self._steps_before_resume = {key: {m.step for m in client.get_metric_history(run_id, key)} for key in keys}
        return self._steps_before_resume

    def checkpoint_saved(self) -> None:
        """A checkpoint is being saved: the journal (the write-ahead log) is fsynced on its worker thread; the held
        metrics go when due; the training thread waits for neither disk nor store (``write_behind``)."""
        if mlflow_logger_run_created(self):
            self.write_behind.checkpoint_saved(self._journal)

    def flush_metrics(self) -> None:
        """Write every metric logged so far now (on this thread, after any write in progress) and fsync the journal."""
        if mlflow_logger_run_created(self):
            self.write_behind.flush(self._journal)

    def log_hyperparams(self, params: Any) -> None:
        """Params are written at once (not queued): ``log_params_once`` reads them back to find changed values."""
        values = dict(params) if isinstance(params, dict) else dict(vars(params)) if hasattr(params, "__dict__") else {}
        self.record("params", values={k: str(v)[:250] for k, v in values.items()})
        if self.store_failure is not None:
            return
        try:
            super().log_hyperparams(params)  # synchronous: the logger is built with synchronous=True
        except Exception as err:  # noqa: BLE001
            self.store_failed(err)

    def add_tags(self, tags: dict[str, Any]) -> None:
        """Tags for the run: set at creation if it does not exist yet, else written to it now (rank 0)."""
        if mlflow_logger_run_created(self) and rank_zero_only.rank == 0:
            self.record("tags", values={k: str(v) for k, v in tags.items()})
            if self.store_failure is not None:
                return
            try:
                for key, value in tags.items():
                    self.experiment.set_tag(self.run_id, key, str(value))
            except Exception as err:  # noqa: BLE001
                self.store_failed(err)
        else:
            self.tags = {**(self.tags or {}), **{k: str(v) for k, v in tags.items()}}

    @rank_zero_only
    def reopen(self) -> None:
        """Mark a continued run (``run_id`` given) as RUNNING again (it may have ended FINISHED, FAILED or KILLED,
        or still read RUNNING after a hard kill) and write the tags that only a new run would get at creation."""
        if self.resumed:
            self.replay_journal()
            self.experiment.update_run(self.run_id, status="RUNNING")
            for key, value in (self.tags or {}).items():
                self.experiment.set_tag(self.run_id, key, str(value))

    def checkpoint_dumped(self, checkpoint: dict[str, Any]) -> None:
        """The checkpoint being written now (``RunContinuity``): its facts are tagged when its file is uploaded."""
        self._file_facts.dumped(checkpoint)

    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        """Remember every checkpoint callback (Lightning's logger keeps only the latest); upload now for "all"."""
        self._checkpoint_callbacks[checkpoint_callback.state_key] = checkpoint_callback
        artifact_files = getattr(checkpoint_callback, "artifact_files", None)
        if callable(artifact_files):
            self._file_facts.saved(artifact_files())
        if mlflow_logger_log_model(self) == "all":
            self.upload_checkpoints(checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if self._catch_up is not None:
            self._catch_up.finish()  # a server back by now gets the journal: no `recipes sync` needed
        self.write_behind.send()
        if mlflow_logger_run_created(self) and mlflow_logger_log_model(self):
            for callback in self._checkpoint_callbacks.values():
                self.upload_checkpoints(callback)
        self._uploader.close(wait=self.store_failure is None)  # a store that is down: `recipes sync` uploads them
        self.write_behind.close()  # the facts of the files uploaded just now, and the writer thread stops
        mlflow_logger_forget_checkpoints(self)  # uploaded above, under fixed names
        if status == "failed" and self.killed_by is not None:
            status = "KILLED"  # MLflow's RunStatus for a run stopped from outside (SIGTERM, Ctrl+C)
        final = {"success": "FINISHED", "failed": "FAILED", "finished": "FINISHED"}.get(status, status)
        self.record("status", status=final, time=int(time.time() * 1000))
        try:
            if self.store_failure is None:
                super().finalize(status)
        except Exception as err:  # noqa: BLE001
            self.store_failed(err)
        if self._journal is not None:
            self._journal.close()
            if self.store_failure is None:  # all of it is in the store: the next command need not replay it
                mark_replayed(self._journal.path, self.store_uri)
        if self.store_failure is not None:
            print(f"recipes: the run's record is in {self._journal_dir}: run `recipes sync` once the store works")

    @rank_zero_only
    def upload_checkpoints(self, checkpoint_callback: ModelCheckpoint) -> None:
        """Queue a callback's checkpoints for upload as ``checkpoints/best.ckpt`` / ``checkpoints/last.ckpt``.

        A callback with an ``artifact_files()`` method (``RunCheckpoint``: ``{alias: file}``) names its own files; a
        plain ``ModelCheckpoint`` gives its best and last paths. Files already uploaded unchanged are skipped. A
        background thread sends them (see ``CheckpointUploader``).
        """
        artifact_files = getattr(checkpoint_callback, "artifact_files", None)
        if callable(artifact_files):
            pairs = list(artifact_files().items())
        else:
            pairs = [("best", checkpoint_callback.best_model_path), ("last", checkpoint_callback.last_model_path)]
        if self._ledger is not None:
            self._ledger.expect()  # `recipes sync` brings the run's checkpoints up to date
        if self.store_failure is not None:
            return  # the store is down: `recipes sync` uploads what the ledger says the run lacks
        uploaded = mlflow_logger_uploaded_files(self)
        for name, path in pairs:
            if not path or not os.path.isfile(path):
                continue
            stamp = file_identity(path)
            if uploaded.get(name) == stamp:
                continue
            self._uploader.submit(name, path)
            uploaded[name] = stamp

    def wait_for_uploads(self) -> None:
        """Send every queued checkpoint upload now (whatever the interval) and block until all have finished."""
        self._uploader.wait()

    def _upload_file(self, local_file: str, name: str) -> None:
        """Send one staged ``<name>.ckpt`` to the run's ``checkpoints/`` artifact directory (replacing it); a store
        that refuses it is the uploader's ``on_failed``, ``store_failed`` (the checkpoint stays on disk)."""
        self.experiment.log_artifact(self.run_id, local_file, CHECKPOINT_ARTIFACT_DIR)

    def _uploaded(self, name: str, identity: tuple[int, int, int]) -> None:
        """An upload went through: the ledger records that version (``recipes sync`` does not send it again), and the
        run is tagged with what that file holds (``loopwise.<name>.epoch``, ``.value``, ...:
        ``recipes.tracking.checkpoint_facts``), so ``--ckpt_path best|last`` elsewhere ranks runs without fetching."""
        if self._ledger is not None:
            self._ledger.mark(str(self.run_id), name, identity)
        tags = self._file_facts.run_tags(name, identity)
        if tags:  # held like the metrics: one store write with them, not about 10 ms of its own on this thread
            self.hold_tags({tag.key: tag.value for tag in tags})


def find_mlflow_logger(loggers: list[Any]) -> MLFlowLogger | None:
    """The first MLflow logger of a trainer, or ``None``."""
    return next((lg for lg in loggers if isinstance(lg, MLFlowLogger)), None)
