"""Real ``kill -9`` trials on the tabular recipe with ``--checkpoint_every_n_steps 3`` (issue 28): each kills a fit at
a chosen moment, from start-up through the checkpoint's fsync and rename, the journal, validation, the epoch's end and
the model logging, and the user's recovery must end exactly as the uninterrupted run.

The fit runs in its own process (forked from a Python that has imported the libraries already:
``tests/preloaded_python.py``): ``python -c "import killpoint; from recipes.cli import main; main([...])"``, where
``killpoint.py`` is written by the test into its own folder and replaces one function (or adds one callback) so that
the process sends itself SIGKILL at that moment: nothing runs after it (no ``finally``, no exception hook, no flush of
what MLflow or the logger still hold), as with ``kill -9`` or the OOM killer. No file chooses what code runs: the
module is the test's own code, named on the command line.

Recovery: ``--ckpt_path last`` (or, when the kill came before the first checkpoint, the same ``fit`` again: the
abandoned run is ended KILLED by that command). Then the weights, optimizer state and ReduceLROnPlateau state equal the
reference's bit for bit, early stopping ends at the same epoch, the run ends FINISHED and its logged values (every
metric, every step) are the reference's. The loop doctor's ``doctor/*`` diagnostics are left out of the comparison
(``logged_values``): they are timings and checks a resumed process re-runs, not results of the training.

Settings (those of ``test_exact_resume_tabular``): 6 train and 2 val batches per epoch, last.ckpt at steps 3, 6
(epoch 0's validation), 9, 12, ...; the reference stops early after epoch 5 (step 36).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.predict.model_logging import MODEL_TAG
from recipes.tracking.journal import JOURNAL_NAME, TrackingJournal, read_journal
from tests.conftest import CONFIGS, REPO, mlflow_client, runs_of
from tests.exact_resume_runs import ARGS, LIMITS, RECIPE, assert_ends_as_the_reference, fit, last_of
from tests.preloaded_python import preloaded_run

KILLPOINT_HEAD = '''
"""Written by tests/end_to_end/test_kill_9_trials.py: SIGKILL to this process at one chosen moment."""
import os
import signal

from lightning.pytorch.callbacks import Callback


def die():
    os.kill(os.getpid(), signal.SIGKILL)


def add_callback(callback):
    from recipes.run.recipes_cli import RecipesCLI

    original = RecipesCLI.default_callbacks
    RecipesCLI.default_callbacks = lambda self, cfg: original(self, cfg) + [callback]


def checkpoint_os(kill_at, step, after=False):
    """Kill at checkpoint_io's call ``kill_at`` (fsync or replace) while it writes the checkpoint of ``step``."""
    import types

    import recipes.checkpoints.atomic_io as io

    saving = {}
    original_save = io.atomic_torch_save

    def atomic_torch_save(obj, path):
        saving["step"] = obj.get("global_step") if isinstance(obj, dict) else None
        try:
            original_save(obj, path)
        finally:
            saving.clear()

    def wrapped(name):
        real = getattr(os, name)

        def call(*args, **kwargs):
            hit = name == kill_at and saving.get("step") == step
            if hit and not after:
                die()
            result = real(*args, **kwargs)
            if hit and after:
                die()
            return result

        return call

    proxy = types.SimpleNamespace(**{k: getattr(os, k) for k in dir(os) if not k.startswith("__")})
    proxy.fsync, proxy.replace = wrapped("fsync"), wrapped("replace")
    io.os = proxy
    io.atomic_torch_save = atomic_torch_save
'''

# moment -> the body of killpoint.py after its head
MOMENTS = {
    # 1. start-up: the MLflow run does not exist yet (the first call that would create it)
    "startup-before-run-created": '''
from mlflow.tracking import MlflowClient

MlflowClient.create_run = lambda *args, **kwargs: die()
''',
    # 2. the run exists, nothing trained
    "run-created-before-first-step": '''
from mlflow.tracking import MlflowClient

_create = MlflowClient.create_run


def create_run(*args, **kwargs):
    _create(*args, **kwargs)
    die()


MlflowClient.create_run = create_run
''',
    # 3. mid-epoch, not a checkpoint step (step 9's last.ckpt is the newest)
    "mid-epoch-step-10": '''
class Kill(Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == 10:
            die()


add_callback(Kill())
''',
    # 4.-6. inside AtomicCheckpointIO, writing step 9's last.ckpt
    "checkpoint-written-before-fsync": 'checkpoint_os("fsync", 9)\n',
    "checkpoint-fsynced-before-replace": 'checkpoint_os("replace", 9)\n',
    "checkpoint-right-after-replace": 'checkpoint_os("replace", 9, after=True)\n',
    # 7. half of a journal line written (the first metrics after step 9's checkpoint)
    "during-journal-append": '''
import json

from recipes.predict.model_logging import MODEL_TAG
from recipes.tracking.journal import TrackingJournal

_record = TrackingJournal.record


def record(self, kind, **data):
    if kind == "metrics" and (data.get("step") or 0) >= 10 and self._handle is not None:
        line = json.dumps({"kind": kind, **data}, default=str)
        self._handle.write(line[: len(line) // 2])
        self._handle.flush()
        die()
    _record(self, kind, **data)


TrackingJournal.record = record
''',
    # 8. epoch 1's validation, at its second batch
    "during-validation": '''
class Kill(Callback):
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking and trainer.current_epoch == 1 and batch_idx == 1:
            die()


add_callback(Kill())
''',
    # 9. after the optimizer step of epoch 1's last batch, before its validation
    "epoch-last-batch": '''
class Kill(Callback):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 1 and batch_idx == 5:
            die()


add_callback(Kill())
''',
    # 10. epoch 1's checkpoints written (ModelCheckpoint's on_train_epoch_end), its train metrics not logged yet:
    # Lightning logs them after every callback's on_train_epoch_end (the fit loop's update_train_epoch_metrics)
    "after-epoch-end-checkpoint-before-train-metrics": '''
from lightning.pytorch.trainer.connectors.logger_connector.logger_connector import _LoggerConnector

_update = _LoggerConnector.update_train_epoch_metrics


def update_train_epoch_metrics(self):
    if self.trainer.current_epoch == 1:
        die()
    _update(self)


_LoggerConnector.update_train_epoch_metrics = update_train_epoch_metrics
''',
    # 11. training over: while the fitted model is logged to MLflow, and at the final status write
    "during-model-logging": '''
from recipes.tracking.tracked_run import TrackedRun

TrackedRun.log_pyfunc_model = lambda *args, **kwargs: die()
''',
    "during-final-status-write": '''
from mlflow.tracking import MlflowClient

MlflowClient.set_terminated = lambda *args, **kwargs: die()
''',
}

# moment -> the global step of the newest last.ckpt after the kill (None: no checkpoint, the recovery is a new fit)
RESUMED_FROM = {
    "startup-before-run-created": None,
    "run-created-before-first-step": None,
    "mid-epoch-step-10": 9,
    "checkpoint-written-before-fsync": 6,
    "checkpoint-fsynced-before-replace": 6,
    "checkpoint-right-after-replace": 9,
    "during-journal-append": 9,
    "during-validation": 9,
    "epoch-last-batch": 9,
    "after-epoch-end-checkpoint-before-train-metrics": 12,
    "during-model-logging": 36,
    "during-final-status-write": 36,
}


def killed_fit(directory: Path, moment: str, *extra: str) -> subprocess.CompletedProcess:
    """The tabular fit in its own process, which kills itself (SIGKILL) at ``moment``."""
    from tests.conftest import recipes_env

    folder = directory / "killpoint"
    folder.mkdir()
    (folder / "killpoint.py").write_text(KILLPOINT_HEAD + MOMENTS[moment], encoding="utf-8")
    args = ["fit", "-c", str(CONFIGS / f"{RECIPE}.yaml"), *LIMITS, *ARGS, *extra]
    code = f"import sys; sys.path.insert(0, {str(folder)!r}); import killpoint; from recipes.cli import main; main({args!r})"
    return preloaded_run([sys.executable, "-c", code], cwd=directory, env=recipes_env(), timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_a_kill_9_at_a_chosen_moment_recovers_to_the_uninterrupted_run(workdir, monkeypatch, reference, moment):
    (workdir / "data").symlink_to(REPO / "data")
    extra = ["--mlflow_model", "true"] if moment == "during-model-logging" else []
    out = killed_fit(workdir, moment, *extra)
    assert out.returncode == -signal.SIGKILL, out.stdout[-2000:] + out.stderr[-3000:]
    killed = runs_of(workdir, RECIPE)
    expected_step = RESUMED_FROM[moment]
    if expected_step is None:  # no checkpoint yet: the user runs the same fit again
        assert not (workdir / "checkpoints" / RECIPE).is_dir() or not list((workdir / "checkpoints" / RECIPE).glob("*/last.ckpt"))
        assert len(killed) == (0 if moment == "startup-before-run-created" else 1)
        fit(monkeypatch, RECIPE, *ARGS, *extra)
        runs = runs_of(workdir, RECIPE)
        if killed:  # the abandoned run is ended KILLED by the next command
            assert [r.info.status for r in runs] == ["KILLED", "FINISHED"]
        else:
            assert [r.info.status for r in runs] == ["FINISHED"]
        run_id = runs[-1].info.run_id
    else:
        (run,) = killed
        run_id = run.info.run_id
        assert last_of(workdir, RECIPE, run_id)["global_step"] == expected_step
        fit(monkeypatch, RECIPE, *ARGS, *extra, "--ckpt_path", "last")
        (resumed,) = runs_of(workdir, RECIPE)
        assert resumed.info.run_id == run_id and resumed.info.status == "FINISHED"
        # the journal holds both attempts, the resume's closed FINISHED (a line the kill cut does not swallow the next)
        entries = read_journal(workdir / "checkpoints" / RECIPE / run_id / JOURNAL_NAME)
        starts = [i for i, e in enumerate(entries) if e["kind"] == "start"]
        assert len(starts) == 2, [e["kind"] for e in entries]
        assert [e["status"] for e in entries[starts[1]:] if e["kind"] == "status"] == ["FINISHED"]
        if moment == "during-model-logging":  # the resume trains nothing more and logs the model the kill stopped
            model_id = resumed.data.tags[MODEL_TAG].removeprefix("models:/")  # an MLflow 3 logged model (issue 30)
            assert mlflow_client(workdir).get_logged_model(model_id).source_run_id == run_id
    assert_ends_as_the_reference(workdir, run_id, reference)


def test_an_attempt_after_a_cut_journal_line_keeps_its_start_entry(tmp_path):
    """A kill in the middle of a journal append leaves a line without its end; the next attempt's "start" entry used
    to be appended to it and lost with it (read_journal skips the broken line), so a replay took the killed attempt
    for the last one and could end a running resume KILLED."""
    path = tmp_path / JOURNAL_NAME
    first = TrackingJournal(path)
    first.record("metrics", step=1, time=0, values={"train/loss": 0.5})
    first.close()
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"kind": "metrics", "step": 2, "val')  # cut by the kill
    second = TrackingJournal(path)
    second.record("status", status="FINISHED", time=1)
    second.close()
    assert [e["kind"] for e in read_journal(path)] == ["start", "metrics", "start", "status"]
