"""A fit stopped from outside (SIGTERM, Ctrl+C) ends cleanly: after the current batch, on every DDP rank together,
with ``last.ckpt`` saved and the MLflow run marked KILLED.

``StopOnSignal`` is shaped like Lightning's ``OnExceptionCheckpoint`` (which saves on any exception): it saves on the
interruptions only, into the run's own ``last.ckpt`` (its ``RunCheckpoint``), and tells the loggers why the run ended.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException

from recipes.compat.internals import can_stop_after_this_batch, hold_stop_request, stop_after_this_batch
from recipes.callbacks.run_checkpoint import RunCheckpoint

SIGNAL_EXIT_CODES = {"SIGINT": 128 + signal.SIGINT, "SIGTERM": 128 + signal.SIGTERM, "SIGUSR1": 128 + signal.SIGUSR1}
#: under DDP the ranks agree on the strongest pending signal (MAX of the numbers): SIGTERM, SIGUSR1, SIGINT
SIGNAL_NAMES = {signal.SIGINT: "SIGINT", signal.SIGUSR1: "SIGUSR1", signal.SIGTERM: "SIGTERM"}


class StopOnSignal(Callback):
    """Stop ``fit`` at a batch boundary on SIGTERM or SIGINT, save ``last.ckpt`` and mark the run KILLED.

    * SIGTERM (Lightning's signal connector raises ``SIGTERMException`` after the current batch) or SIGINT/Ctrl+C
      during fit: ``last.ckpt`` is written to the run's checkpoint directory and the run ends ``KILLED`` instead
      of ``FAILED``; the process exits 143 (SIGTERM) or 130 (SIGINT). A first SIGINT is routed into Lightning's
      SIGTERM path, so training stops at a batch boundary and the checkpoint is consistent; a second one raises
      ``KeyboardInterrupt`` at once (Lightning's own handling: the run still ends ``KILLED``, exit code 1, and no
      checkpoint is written since the interrupted step may be half done; the previous ``last.ckpt`` stays).
      Other exceptions leave Lightning's ``FAILED``.
    * Under DDP a signal only marks itself pending; after every train batch the ranks agree on it (an
      ``all_reduce``), so all of them stop after the same batch and save ``last.ckpt`` together. Lightning 2.6's
      own SIGTERM handler calls ``dist.broadcast`` inside the signal handler, at whatever point rank 0 is (e.g. in
      the forward pass while rank 1 waits in the backward all-reduce): a deadlock, so under DDP it is replaced
      during training too.
    * A signal that arrives during a fit's validation, or in the train batch just before it (an epoch's last),
      stops after that validation and its checkpoints, and after the epoch's end when it ends an epoch; Lightning
      would abort the validation after its current batch, and the resume from that ``last.ckpt`` failed.
    * Under SLURM (Lightning's ``SLURMEnvironment.detect``) SIGUSR1, the signal SLURM sends before it kills a job,
      stops the fit as SIGTERM does (exit 138); the command then requeues the job (``recipes.run.slurm``).
    * Loggers with a ``mark_killed(reason)`` method (``RecipeLogger``) are told which signal ended the run.
    * A signal that cannot be honoured at a batch boundary because the process is stuck (a call that does not
      return: a tracker, a file system) is not the last word: a second SIGTERM, or a third SIGINT, ends the process
      at once (``exit_now``: one line, then killed by the signal itself: 143 / 130 in a shell). What was written stays: the run's journal (written line by
      line) and the last ``last.ckpt`` (written atomically).
    """

    def __init__(self) -> None:
        self.interrupted: str | None = None
        self._pending_signal: int | None = None  # DDP only: the signal received and not yet agreed on (0: none)
        self._held = False  # a stop requested before or during a fit's validation, waiting for its end
        self._received: dict[str, int] = {}  # how many times each signal arrived during this fit

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.interrupted = None
        self._pending_signal = None
        self._received = {}
        self._held = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._route_signals(trainer)

    def _route_signals(self, trainer: pl.Trainer) -> None:
        """First SIGINT: stop after the current batch like SIGTERM does; Lightning's teardown restores the handler
        that was installed before ``fit`` (it saves all handlers when it registers its own)."""
        if threading.current_thread() is not threading.main_thread():
            return
        distributed = trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

        def on_sigint(signum: int, frame: Any) -> None:
            if self._count("SIGINT") >= 3:
                exit_now("SIGINT")
            if self.interrupted == "SIGINT" or self._pending_signal or not can_stop_after_this_batch(trainer):
                raise KeyboardInterrupt
            if distributed:
                self._pending_signal = signal.SIGINT
            else:
                self.interrupted = "SIGINT"
                stop_after_this_batch(trainer)
            print("SIGINT: stopping after this batch (press Ctrl+C again to abort at once)", flush=True)

        signal.signal(signal.SIGINT, on_sigint)
        lightning_sigterm = signal.getsignal(signal.SIGTERM)  # Lightning's: stop after this batch

        def on_sigterm(signum: int, frame: Any) -> None:
            if self._count("SIGTERM") >= 2:
                exit_now("SIGTERM")
            if distributed:
                self._pending_signal = signal.SIGTERM
            elif callable(lightning_sigterm):
                lightning_sigterm(signum, frame)

        if distributed:
            self._pending_signal = 0
        signal.signal(signal.SIGTERM, on_sigterm)
        if SLURMEnvironment.detect():  # SLURM's pre-kill signal (--signal=USR1@90): stop as on SIGTERM, requeue after

            def on_sigusr1(signum: int, frame: Any) -> None:
                if distributed:
                    self._pending_signal = max(self._pending_signal or 0, int(signal.SIGUSR1))
                else:
                    self.interrupted = self.interrupted or "SIGUSR1"
                    if callable(lightning_sigterm):
                        lightning_sigterm(signal.SIGTERM, frame)

            signal.signal(signal.SIGUSR1, on_sigusr1)

    def _count(self, name: str) -> int:
        """Count one more arrival of signal ``name``; how many so far in this fit."""
        self._received[name] = self._received.get(name, 0) + 1
        return self._received[name]

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """DDP: agree on a pending signal (SIGTERM wins over SIGINT); every rank then stops after this batch."""
        if self._pending_signal is None:
            return
        flag = torch.tensor([int(self._pending_signal)], device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        agreed = int(flag.item())
        if agreed:
            self.interrupted = SIGNAL_NAMES.get(agreed, "SIGTERM")
            if trainer.is_global_zero:
                print(f"{self.interrupted}: every process stops after this batch", flush=True)
            stop_after_this_batch(trainer)  # Lightning raises SIGTERMException on every rank

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """A stop requested in the batch before a fit's validation or during it waits for the validation's end:
        Lightning would abort the validation after this batch, and a run resumed from that ``last.ckpt`` cannot
        finish it (at an epoch's end the resume failed: the monitored metric is missing)."""
        if trainer.state.fn == "fit" and not trainer.sanity_checking and hold_stop_request(trainer):
            self._held = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._held:  # the validation's checkpoints are written next; Lightning stops after the epoch's end
            self._held = False
            stop_after_this_batch(trainer)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        if isinstance(exception, SIGTERMException):
            self.interrupted = self.interrupted or "SIGTERM"
            exception.code = SIGNAL_EXIT_CODES[self.interrupted]
        else:  # a second Ctrl+C (or one before training started): the step may be half done, keep last.ckpt
            self.interrupted = "SIGINT"
        for logger in trainer.loggers:
            mark_killed = getattr(logger, "mark_killed", None)
            if callable(mark_killed):
                mark_killed(self.interrupted)
        last = next(
            (c for c in trainer.checkpoint_callbacks if isinstance(c, RunCheckpoint) and c.alias == "last"), None
        )
        if last is None or last.path is None or trainer.state.fn != "fit" or isinstance(exception, KeyboardInterrupt):
            return
        try:
            path = last.save_now(trainer)
        except Exception as err:  # noqa: BLE001  (the run is ending anyway; say so and keep the status right)
            warnings.warn(f"StopOnSignal: could not save {last.path} after {self.interrupted}: {err}", stacklevel=2)
            return
        if trainer.is_global_zero:
            print(
                f"{self.interrupted} received: saved {path} at step {trainer.global_step}; "
                f"resume with --ckpt_path {path} (or last)",
                flush=True,
            )


def exit_now(name: str) -> None:
    """A repeated signal while the first one's stop has not come through: one line, then the process ends at once,
    killed by that signal with its default action (a shell reports 143 for SIGTERM, 130 for SIGINT), running
    nothing else that could be stuck too."""
    print(
        f"recipes: {name} again before the run could stop: exiting now; the run's journal and its last saved "
        "last.ckpt are kept (`recipes sync` writes the record to the store, `--ckpt_path last` resumes)",
        file=sys.stderr,
        flush=True,
    )
    number = getattr(signal, name)
    signal.signal(number, signal.SIG_DFL)
    os.kill(os.getpid(), number)
