"""RecipeLogger: checkpoints uploaded during training and replaced, asynchronous metrics complete at the end, the
background uploader's newest-wins rule, and the tracking-server check."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from datamodules import SpiralDataModule
from lightning_modules import ClassificationModule
from lightning_modules.models import MLP
from recipes.tracking.uploads import CheckpointUploader
from recipes.callbacks.run_checkpoint import RunCheckpoint
from recipes.tracking.logger import RecipeLogger
from recipes.tracking.uris import TrackingServerUnreachable, check_tracking_server
from recipes.tracking.failures import short_reason

from tests.conftest import mlflow_client


# --- CheckpointUploader -----------------------------------------------------------------------------------------
def test_uploader_snapshots_the_file_and_sends_the_newest_version_of_a_name(tmp_path: Path) -> None:
    sent: list[tuple[str, bytes]] = []
    first_started, release = threading.Event(), threading.Event()

    def upload(local: str, name: str) -> None:
        assert Path(local).name == f"{name}.ckpt"
        sent.append((name, Path(local).read_bytes()))
        first_started.set()
        assert release.wait(10)

    uploader = CheckpointUploader(upload)
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"v1")
    uploader.submit("last", ckpt)
    assert first_started.wait(10)  # v1 is being uploaded
    ckpt.write_bytes(b"v2")
    uploader.submit("last", ckpt)
    ckpt.write_bytes(b"v3")  # the trainer rewrites the file: v2 was snapshotted at submit
    uploader.submit("last", ckpt)
    (tmp_path / "best.ckpt").write_bytes(b"b1")
    uploader.submit("best", tmp_path / "best.ckpt")
    release.set()
    uploader.close()
    # v2 was replaced by v3 while v1 was still uploading: the store gets v1 then the newest file, never v2
    assert sent == [("last", b"v1"), ("last", b"v3"), ("best", b"b1")]
    assert uploader.errors == []


def test_uploader_failure_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    def upload(local: str, name: str) -> None:
        raise ConnectionError("store down")

    uploader = CheckpointUploader(upload)
    (tmp_path / "x.ckpt").write_bytes(b"x")
    with pytest.warns(UserWarning, match="could not upload last.ckpt: ConnectionError: store down"):
        uploader.submit("last", tmp_path / "x.ckpt")
        uploader.close()
    assert uploader.errors and uploader.uploaded == []


def test_uploader_sends_a_name_at_most_once_per_interval_and_wait_sends_the_newest(tmp_path: Path) -> None:
    sent: list[tuple[str, bytes]] = []
    uploader = CheckpointUploader(lambda local, name: sent.append((name, Path(local).read_bytes())), 3600)
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"v1")
    uploader.submit("last", ckpt)  # the first upload of a name goes out at once, snapshotted now
    ckpt.write_bytes(b"v2")
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == [("last", b"v1")]
    for version in (b"v3", b"v4"):  # within the interval: held back, the newer replacing the older
        ckpt.write_bytes(version)
        uploader.submit("last", ckpt)
    (tmp_path / "best.ckpt").write_bytes(b"b1")
    uploader.submit("best", tmp_path / "best.ckpt")  # another name has its own interval: out at once
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)  # room for a wrongly released "last" to go out too
    assert sorted(sent) == [("best", b"b1"), ("last", b"v1")]
    ckpt.write_bytes(b"v5")  # a deferred version is read when it is sent: the trainer's newest file
    uploader.wait()  # sends what is pending now, whatever the interval
    assert sent[-1] == ("last", b"v5") and len(sent) == 3
    uploader.close()
    assert uploader.errors == []


def test_uploader_sends_a_deferred_version_by_itself_when_its_interval_has_passed(tmp_path: Path) -> None:
    sent: list[tuple[bytes, float]] = []
    uploader = CheckpointUploader(lambda local, name: sent.append((Path(local).read_bytes(), time.monotonic())), 0.5)
    ckpt = tmp_path / "last.ckpt"
    deadline = time.monotonic() + 10
    for count, version in enumerate((b"v1", b"v2"), start=1):
        ckpt.write_bytes(version)
        uploader.submit("last", ckpt)
        while len(sent) < count and time.monotonic() < deadline:  # v1 out before v2 comes (else v2 replaces it)
            time.sleep(0.02)
    assert [v for v, _ in sent] == [b"v1", b"v2"]  # no wait() needed
    assert sent[1][1] - sent[0][1] >= 0.5 - 0.05
    uploader.close()


def test_a_newer_version_of_a_waiting_name_does_not_wake_the_uploader(tmp_path: Path) -> None:
    """At every save the logger submits best and last; within their interval each replaces a version already
    waiting, whose time it keeps, so the worker thread is not woken (each wake takes Python's lock from the
    training thread). A first submission of a name, and a due one, still wake it; the newest version goes out."""
    sent: list[tuple[str, bytes]] = []
    uploader = CheckpointUploader(lambda local, name: sent.append((name, Path(local).read_bytes())), 3600)
    wakes = []
    notify = uploader._cond.notify_all
    uploader._cond.notify_all = lambda: (wakes.append(1), notify())  # type: ignore[method-assign]
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"v1")
    uploader.submit("last", ckpt)  # due: out at once
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    ckpt.write_bytes(b"v2")
    uploader.submit("last", ckpt)  # deferred, nothing waiting yet: the worker learns its time
    woken = len(wakes)
    for version in (b"v3", b"v4", b"v5"):
        ckpt.write_bytes(version)
        uploader.submit("last", ckpt)  # replaces the waiting version: no wake-up
    assert len(wakes) == woken
    uploader.wait()
    assert sent == [("last", b"v1"), ("last", b"v5")]
    uploader.close()
    assert uploader.errors == []


def test_a_deferred_file_replaced_by_a_newer_version_is_skipped_quietly(tmp_path: Path, monkeypatch) -> None:
    """A trainer that keeps one best file under changing names (ModelCheckpoint's epoch=N files) submits the new file,
    then deletes the old one, possibly while the worker is about to copy the old one: the newer version goes out,
    with no warning; a file that is gone with nothing newer waiting is still a warning."""
    import recipes.tracking.uploads as checkpoint_upload

    sent: list[bytes] = []
    uploader = CheckpointUploader(lambda local, name: sent.append(Path(local).read_bytes()), 0.3)
    first, second, third = (tmp_path / f"epoch={i}.ckpt" for i in range(3))
    first.write_bytes(b"e0")
    uploader.submit("best", first)
    deadline = time.monotonic() + 10
    while not sent and time.monotonic() < deadline:
        time.sleep(0.01)
    real_copy = shutil.copyfile

    def trainer_moves_on_during_the_copy(source: Path, target: Path) -> object:
        if Path(source) == second:  # the worker's turn for the deferred version: the trainer saves a new best
            third.write_bytes(b"e2")
            uploader.submit("best", third)
            second.unlink()
        return real_copy(source, target)

    monkeypatch.setattr(checkpoint_upload.shutil, "copyfile", trainer_moves_on_during_the_copy)
    second.write_bytes(b"e1")
    uploader.submit("best", second)  # within the interval: deferred, copied when sent
    deadline = time.monotonic() + 10
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sent == [b"e0", b"e2"] and uploader.errors == []  # e1 was gone, e2 went out in its place, no warning
    monkeypatch.setattr(checkpoint_upload.shutil, "copyfile", real_copy)
    gone = tmp_path / "gone.ckpt"
    gone.write_bytes(b"x")
    uploader.submit("best", gone)  # deferred again, and deleted with nothing newer
    gone.unlink()
    with pytest.warns(UserWarning, match="could not stage .*gone.ckpt for upload as best.ckpt"):
        uploader.close()
    assert sent == [b"e0", b"e2"]


def test_a_copy_during_which_the_file_changed_is_copied_again_not_uploaded(tmp_path: Path, monkeypatch) -> None:
    """A writer that is not atomic (Lightning's ModelCheckpoint moves its temp file into place, a copy across
    filesystems) can overlap a copy and tear it: a copy during which the file changed is dropped and the file
    copied again, both on the training thread (a due save) and in the worker (a deferred one)."""
    import recipes.tracking.uploads as checkpoint_upload

    sent: list[bytes] = []
    uploader = CheckpointUploader(lambda local, name: sent.append(Path(local).read_bytes()), 3600)
    ckpt = tmp_path / "last.ckpt"
    real_copy = shutil.copyfile
    copies: list[bytes] = []

    def copy_while_the_trainer_writes(source: Path, target: Path) -> object:
        result = real_copy(source, target)
        copies.append(Path(target).read_bytes())
        if Path(source).read_bytes().endswith(b"half"):  # the write is still going on after the copy
            with open(source, "ab") as file:
                file.write(b" and the rest")
        return result

    monkeypatch.setattr(checkpoint_upload.shutil, "copyfile", copy_while_the_trainer_writes)
    ckpt.write_bytes(b"v1 first half")
    uploader.submit("last", ckpt)  # due: copied on this thread, torn, handed to the worker to copy again
    uploader.wait()
    assert copies == [b"v1 first half", b"v1 first half and the rest"]
    assert sent == [b"v1 first half and the rest"]
    ckpt.write_bytes(b"v2 first half")
    uploader.submit("last", ckpt)  # within the interval: deferred, copied by the worker
    uploader.close()  # sends it now: the worker's torn copy is dropped, the file copied again
    assert copies[2:] == [b"v2 first half", b"v2 first half and the rest"]
    assert sent == [b"v1 first half and the rest", b"v2 first half and the rest"] and uploader.errors == []


def test_a_fast_run_uploads_each_checkpoint_about_once_per_interval(workdir: Path) -> None:
    """Saves every fraction of a second (one per epoch) are folded: with the default 30 s interval a 4-epoch run
    uploads each name once during training and once more at the end, and the store ends with the final files."""
    pl.seed_everything(0)
    logger = RecipeLogger(experiment_name="throttled")
    assert logger._uploader.min_interval_s == 30.0
    uploads: list[str] = []
    send = logger._upload_file
    logger._upload_file = lambda local, name: (uploads.append(name), send(local, name))[1]  # type: ignore[method-assign]
    logger._uploader._upload = logger._upload_file
    last = RunCheckpoint(workdir / "ckpt", "throttled", "last")
    trainer = pl.Trainer(
        max_epochs=4,
        logger=logger,
        callbacks=[RunCheckpoint(workdir / "ckpt", "throttled", "best", monitor="val/acc", mode="max"), last],
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = ClassificationModule(model=MLP(2, 3, hidden_sizes=[16]), num_classes=3)
    trainer.fit(module, datamodule=SpiralDataModule(n_samples=300, batch_size=32))
    assert uploads.count("last") == 2 and uploads.count("best") <= 2  # instead of 4 each
    local = mlflow_client(workdir).download_artifacts(logger.run_id, "checkpoints/last.ckpt", str(workdir))
    assert Path(local).read_bytes() == Path(last.last_model_path or last.best_model_path).read_bytes()
    assert torch.load(local, weights_only=True, map_location="cpu")["epoch"] == 3


# --- RecipeLogger during training ---------------------------------------------------------------------------------
class ArtifactProbe(pl.Callback):
    """After each epoch's checkpoints (ModelCheckpoint callbacks run last, so: at the start of the next epoch and at
    the end of training), the run's checkpoints/last.ckpt equals the file on disk right now."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.epochs: list[int] = []

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.current_epoch > 0:
            self.check(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.check(trainer)

    def check(self, trainer: pl.Trainer) -> None:
        logger = trainer.logger
        assert isinstance(logger, RecipeLogger)
        logger.wait_for_uploads()
        last = next(c for c in trainer.checkpoint_callbacks if getattr(c, "alias", None) == "last")
        target = self.tmp / f"epoch{trainer.current_epoch}"
        target.mkdir()
        local = logger.experiment.download_artifacts(logger.run_id, "checkpoints/last.ckpt", str(target))
        assert Path(local).read_bytes() == Path(last.last_model_path or last.best_model_path).read_bytes()
        saved = torch.load(local, weights_only=True, map_location="cpu")
        self.epochs.append(saved["epoch"])


def test_checkpoints_are_uploaded_during_training_and_replaced(workdir: Path) -> None:
    pl.seed_everything(0)
    logger = RecipeLogger(experiment_name="uploads")
    probe = ArtifactProbe(workdir / "downloads")
    (workdir / "downloads").mkdir()
    trainer = pl.Trainer(
        max_epochs=3,
        logger=logger,
        callbacks=[
            RunCheckpoint(workdir / "ckpt", "uploads", "best", monitor="val/acc", mode="max"),
            RunCheckpoint(workdir / "ckpt", "uploads", "last"),
            probe,
        ],
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=5,
    )
    module = ClassificationModule(model=MLP(2, 3, hidden_sizes=[16]), num_classes=3)
    trainer.fit(module, datamodule=SpiralDataModule(n_samples=300, batch_size=32))
    assert probe.epochs == [0, 1, 2]  # the artifact followed the file after every epoch, not only at the end
    client = mlflow_client(workdir)
    names = {a.path for a in client.list_artifacts(logger.run_id, "checkpoints")}
    assert names == {"checkpoints/best.ckpt", "checkpoints/last.ckpt"}
    # metrics were queued asynchronously; ending the run waited for them: every logged step is in the store
    history = client.get_metric_history(logger.run_id, "train/loss")
    steps_per_epoch = len(trainer.datamodule.train_dataloader())  # type: ignore[union-attr]
    assert [m.step for m in history] == list(range(4, 3 * steps_per_epoch, 5))
    assert len(client.get_metric_history(logger.run_id, "val/acc")) == 3
    assert client.get_run(logger.run_id).info.status == "FINISHED"


@pytest.mark.slow  # a recipe fit of 3 epochs (a few seconds)
def test_an_uploaded_checkpoint_s_facts_are_held_with_the_metrics_not_written_by_the_upload_thread(
        workdir: Path, monkeypatch) -> None:
    """The run tags that describe an uploaded file (``loopwise.best.epoch``, ...) go to the journal at once and to the
    store with the held metrics: the upload thread makes no store write of its own (each was a synchronous
    ``log_batch``, about 10 ms of SQLAlchemy holding the GIL while the training thread waited), and the store has
    the facts of the final files when the run ends."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from recipes.cli import main
    from recipes.tracking.journal import JOURNAL_NAME, read_journal

    writers: list[tuple[str, list[str]]] = []  # (thread, tag keys) of every store write of the run's values
    store_log_batch = SqlAlchemyStore.log_batch

    def seen(store: SqlAlchemyStore, run_id: str, metrics: list, params: list, tags: list) -> None:
        writers.append((threading.current_thread().name, [t.key for t in tags]))
        return store_log_batch(store, run_id, metrics, params, tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", seen)
    main(["fit", "-c", str(Path(__file__).parents[2] / "configs" / "spiral_mlp.yaml"), "--trainer.max_epochs", "3",
          "--data.n_samples", "400"])
    assert [keys for thread, keys in writers if thread == "loopwise-upload"] == []
    assert any("loopwise.best.epoch" in keys for thread, keys in writers)  # written, with the held values
    client = mlflow_client(workdir)
    (run,) = client.search_runs([client.get_experiment_by_name("spiral_mlp").experiment_id])
    tags = run.data.tags
    # the final files' facts, numbered as the messages show them (issue 53: epochs counted from 1; the best file's
    # step is the step its metric value was logged at; the last file's is its checkpoint's, loopwise.checkpoint_step)
    assert int(tags["loopwise.last.epoch"]) == 3 and 1 <= int(tags["loopwise.best.epoch"]) <= 3
    assert tags["loopwise.last.step"] == tags["loopwise.checkpoint_step"]
    history = client.get_metric_history(run.info.run_id, tags["loopwise.best.monitor"])
    [chosen] = [m for m in history if m.value == float(tags["loopwise.best.value"])][:1]
    assert int(tags["loopwise.best.step"]) == chosen.step
    assert history.index(chosen) + 1 == int(tags["loopwise.best.epoch"])  # one validation per epoch
    (journal,) = workdir.rglob(JOURNAL_NAME)
    journaled = {k: v for e in read_journal(journal) if e.get("kind") == "tags" for k, v in e["values"].items()}
    for key in ("loopwise.best.epoch", "loopwise.best.value", "loopwise.last.epoch"):
        assert journaled[key] == tags[key]  # a replay after a kill restores them


def test_metrics_go_out_in_batches_and_the_store_writes_are_merged(workdir: Path, monkeypatch) -> None:
    """The logger holds metrics for up to 5 s (and writes them at every checkpoint save and at the end): a short run
    writes its whole history in a few ``log_batch`` calls, never a write per metric or per step, and every metric
    reaches the store with its own step."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    writes: list[int] = []
    store_log_batch = SqlAlchemyStore.log_batch

    def count_writes(store: SqlAlchemyStore, run_id: str, metrics: list, params: list, tags: list) -> None:
        if metrics:  # params and tags go out synchronously on their own
            writes.append(len(metrics))
        return store_log_batch(store, run_id, metrics, params, tags)

    monkeypatch.setattr(SqlAlchemyStore, "log_batch", count_writes)
    pl.seed_everything(0)
    logger = RecipeLogger(experiment_name="batches")
    batches: list[list[tuple[int, str]]] = []
    client_log_batch = logger.experiment.log_batch

    def record(*args: object, **kwargs: object) -> None:
        batches.append([(m.step, m.key) for m in kwargs.get("metrics", ())])  # type: ignore[attr-defined]
        return client_log_batch(*args, **kwargs)

    monkeypatch.setattr(logger.experiment, "log_batch", record)
    monkeypatch.setattr(logger.experiment, "log_metric", lambda *a, **k: pytest.fail("a metric was written alone"))
    trainer = pl.Trainer(max_epochs=3, logger=logger, log_every_n_steps=5, enable_checkpointing=False,
                         callbacks=[pl.callbacks.LearningRateMonitor("step")], enable_progress_bar=False,
                         enable_model_summary=False)
    module = ClassificationModule(model=MLP(2, 3, hidden_sizes=[16]), num_classes=3)
    trainer.fit(module, datamodule=SpiralDataModule(n_samples=300, batch_size=32))
    assert 1 <= len(batches) <= 3  # 24 steps, 3 epochs: held, written at the end (and every 5 s)
    logged = {entry for batch in batches for entry in batch}
    assert {(4, "lr-AdamW/decay"), (4, "train/loss"), (9, "train/loss")} <= logged
    assert {"train/acc", "train/f1", "val/acc", "val/loss"} <= {key for _, key in logged}
    assert len({step for step, _ in logged}) > 3  # one write carries many steps, each metric with its own
    assert sum(writes) == sum(len(batch) for batch in batches)  # every metric reached the store
    client = mlflow_client(workdir)
    assert [m.step for m in client.get_metric_history(logger.run_id, "train/loss")] == [4, 9, 14, 19]


def test_synchronous_logging_can_be_chosen(workdir: Path) -> None:
    logger = RecipeLogger(experiment_name="sync", synchronous=True)
    logger.log_metrics({"a": 1.0, "b": 2.0}, step=3)
    client = mlflow_client(workdir)
    assert client.get_run(logger.run_id).data.metrics == {"a": 1.0, "b": 2.0}  # stored before log_metrics returned


# --- tracking server check ---------------------------------------------------------------------------------------
@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_local_stores_are_not_probed(workdir: Path) -> None:
    check_tracking_server(f"sqlite:///{workdir}/mlflow.db")
    check_tracking_server(str(workdir / "mlruns"))
    assert not (workdir / "mlflow.db").exists()


def test_unreachable_server_fails_in_seconds_with_the_reason() -> None:
    start = time.perf_counter()
    with pytest.raises(TrackingServerUnreachable) as err:
        check_tracking_server("http://127.0.0.1:1")
    assert time.perf_counter() - start < 30  # MLflow's default retries would take minutes
    assert "http://127.0.0.1:1 does not answer ([Errno 111] Connection refused)" in str(err.value)


def test_short_reason_keeps_the_errno_part() -> None:
    text = (
        "API request failed with exception HTTPConnectionPool(host='h', port=5): Max retries exceeded "
        "(Caused by NewConnectionError(\"...: Failed to establish a new connection: [Errno 111] Connection refused\"))"
    )
    assert short_reason(Exception(text)) == "[Errno 111] Connection refused"
    assert short_reason(Exception("x" * 500)).endswith("...")


def test_one_background_thread_writes_the_held_metrics_and_none_goes_through_mlflows_async_queue(
    workdir: Path, monkeypatch
) -> None:
    """One journal, one writer (issue 54): the training thread holds the values; the logger's one writer thread puts
    them into the store every ``hold_seconds``, synchronously, in the order they were logged; MLflow's asynchronous
    queue (a second buffer in series, with its own threads) is not used."""
    from mlflow.tracking import MlflowClient

    writes: list[tuple[str, bool, list[float]]] = []
    log_batch = MlflowClient.log_batch

    def spy(self, run_id, metrics=(), params=(), tags=(), synchronous=None, **kwargs):
        writes.append((threading.current_thread().name, synchronous, [m.value for m in metrics if m.key == "a"]))
        return log_batch(self, run_id, metrics=metrics, params=params, tags=tags, synchronous=synchronous, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", spy)
    earlier = {t.ident for t in threading.enumerate()}  # another test's, if any
    logger = RecipeLogger(experiment_name="one_writer")
    logger.write_behind.hold_seconds = 0.2
    for step in range(5):
        logger.log_metrics({"a": float(step)}, step=step)
    assert writes == []  # the training thread wrote nothing
    deadline = time.monotonic() + 30
    while not writes and time.monotonic() < deadline:
        time.sleep(0.05)
    for step in range(5, 8):
        logger.log_metrics({"a": float(step)}, step=step)
    logger.finalize("success")
    assert writes and writes[0][0] == "loopwise-store-writer" and all(sync is True for _, sync, _ in writes)
    assert [v for _, _, values in writes for v in values] == [float(s) for s in range(8)]  # in order, each once
    assert not [t.name for t in threading.enumerate() if t.ident not in earlier
                and (t.name == "loopwise-store-writer" or "MLflow" in t.name)]  # stopped; none of MLflow's started
    client = mlflow_client(workdir)
    assert [m.value for m in client.get_metric_history(logger.run_id, "a")] == [float(s) for s in range(8)]


# --- a command leaves the process as it found it ---------------------------------------------------------------------
def test_a_second_recipe_in_the_same_process_logs_into_its_own_store_not_the_first_ones(workdir: Path,
                                                                                         monkeypatch) -> None:
    """Lightning's MLFlowLogger sets MLflow's global tracking URI (exported as MLFLOW_TRACKING_URI) to the run's store;
    before the fix the next recipe of the same process (a notebook) read it as the user's and logged into the first
    folder's store (or failed when that folder was gone), and the user's own code ran on in deterministic mode (the
    spiral recipe's `deterministic: true`) with the run's PL_GLOBAL_SEED, OMP_NUM_THREADS and CUBLAS_WORKSPACE_CONFIG
    exported. Each command now leaves the environment, MLflow's global URI and torch's switches as it found them."""
    import mlflow
    import torch

    from recipes.cli import main
    from recipes.run.process_settings import TorchSwitches
    from tests.conftest import SPIRAL, runs_of

    monkeypatch.setenv("MLFLOW_ASYNC_LOGGING_BUFFERING_SECONDS", "7")  # the user's own choice stays
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    deterministic = torch.are_deterministic_algorithms_enabled()  # another test's Trainer may have left it on
    torch.use_deterministic_algorithms(False)  # as a notebook starts: the spiral recipe turns it on for its run
    def global_uri() -> str | None:  # MLflow's default URI is relative to the working directory: None when unset
        return mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None

    before = (dict(os.environ), global_uri(), TorchSwitches.now())
    tiny = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", "--trainer.max_epochs", "1",
            "--mlflow_model", "false", "--system_metrics_interval", "0", "--torch_threads", "1"]
    first, second = workdir / "first", workdir / "second"
    for folder in (first, second):
        folder.mkdir()
        monkeypatch.chdir(folder)
        main(["fit", "-c", str(SPIRAL), *tiny])
        assert (dict(os.environ), global_uri(), TorchSwitches.now()) == before
    torch.use_deterministic_algorithms(deterministic)
    assert len(runs_of(first, "spiral_mlp")) == 1
    assert len(runs_of(second, "spiral_mlp")) == 1


def test_after_a_command_the_tracking_uri_follows_the_environment_again(workdir: Path, monkeypatch) -> None:
    """A user who points MLFLOW_TRACKING_URI at one store, runs a command, then points it at another: MLflow follows
    the environment again (before the fix the URI Lightning's logger set during the run stayed MLflow's global one,
    which wins over the environment)."""
    import mlflow

    from recipes.cli import main
    from recipes.run.process_settings import process_settings_kept
    from tests.conftest import SPIRAL, runs_of

    first, second = (f"sqlite:///{workdir / name / 'mlflow.db'}" for name in ("first", "second"))
    (workdir / "first").mkdir()
    with process_settings_kept():  # this process's own URI (another test's) back after the test
        mlflow.set_tracking_uri(None)  # as in a new process: no URI set in it, the environment decides
        monkeypatch.setenv("MLFLOW_TRACKING_URI", first)
        main(["fit", "-c", str(SPIRAL), "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1",
              "--trainer.max_epochs", "1", "--mlflow_model", "false", "--system_metrics_interval", "0"])
        assert len(runs_of(workdir / "first", "spiral_mlp")) == 1
        monkeypatch.setenv("MLFLOW_TRACKING_URI", second)
        assert mlflow.get_tracking_uri() == second
