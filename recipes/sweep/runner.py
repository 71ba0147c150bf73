"""The loop of ``recipes sweep``: ask the study for a trial, run it as a recipe fit, tell the study, record it.

Every trial runs ``TrialCLI(trial, ["fit", ...])`` in this process with its sampled values appended
(``recipes.sweep.trial_cli``: its MLflow run nests under the parent; ``TrialPruning`` reports each validation).
Its outcome in Optuna and MLflow:

* COMPLETE: the objective is the best value of the metric over its validations; the run ends FINISHED.
* PRUNED: the pruner stopped it after a validation; the run is KILLED with the tag ``loopwise.sweep.pruned``.
* FAIL: anything that ended the fit with an error (a bad combination of values, NaN, out of memory): the run ends
  FAILED (or has none, when the error came before the trainer), the reason is the trial's user attribute
  ``failure`` and the run's tag ``loopwise.sweep.failure``; the sweep goes on.
* Ctrl+C / SIGTERM: the recipe saves ``last.ckpt`` and marks the run KILLED; the trial is FAIL (user attribute
  ``interrupted``), the sweep stops (exit 130 / 143, as a fit), and the same command later continues the study.

The worker tags the parent run as one of its workers (``recipes.sweep.workers``) and, when it stops, ends the parent
(FINISHED, KILLED when interrupted, FAILED on an error) unless another worker is still at it. What a worker killed
beside it left (``settle_dead_workers``) is settled when this one starts, before each trial it starts and when it
ends: the dead worker's RUNNING trial is failed in Optuna (it does not use the ``--n_trials`` budget), its run gets
the values its journal holds and ends KILLED (``replay_pending``: no ``recipes sync`` needed), and the parent's
counts (``trials_*``) are written again from the study when this worker ends, so they are Optuna's. The failed
trial is queued again with its values; its retry trains on from the killed run's ``last.ckpt`` in a run of its own
(``retry_link``).
"""

from __future__ import annotations

import json
import socket
import tempfile
import time
from contextlib import nullcontext, suppress
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from jsonargparse import Namespace
from lightning.pytorch.utilities.exceptions import SIGTERMException
from mlflow.tracking import MlflowClient
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from recipes.tracking.sqlite_store import prepare_sqlite_store
from recipes.tracking.quiet_mlflow import no_progress_bar
from recipes.sweep.objective import objective_of
from recipes.sweep.space import SweepFile, choice_value
from recipes.sweep.study import (
    counts,
    create_parent_run,
    default_storage,
    open_study,
    record_progress,
    shown_storage,
    sqlite_path,
    trial_start_lock,
    wait_for_parent_run,
)
from recipes.tracking.abandoned_runs import close_abandoned_runs, workers_alive
from recipes.tracking.pending_replay import replay_pending
from recipes.sweep.processes import announce_trial
from recipes.callbacks.stop_on_signal import SIGNAL_EXIT_CODES
from recipes.sweep.heartbeat import (ask, beating, fail_stale_trials, first_beat, frozen_trial, queued_again, retry,
                                     retry_chain)
from recipes.sweep.workers import claim_trial, fail_abandoned_trials, mark_dead_workers, mark_worker, record_abandoned
from recipes.sweep.trial import ActiveTrial, RetryOf
from recipes.sweep.trial_cli import run_trial
from recipes.tracking.config import experiment_name, tracking_uri
from recipes.tracking.logger import CHECKPOINT_ARTIFACT_DIR
from recipes.checkpoints.run_lock import run_lock_holder
from recipes.checkpoints.run_stamp import RESUMED_FROM_STEP_TAG, RESUMED_FROM_TAG

PROG = "recipes sweep"
MAX_TRIALS_FACTOR = 10  # a study stops starting trials after this many times --n_trials finished ones
WAIT_INTERVALS = 6  # heartbeat intervals a worker waits for others' trials that may complete the study (or die)
WAIT_S = 2.0  # between two looks at the study while the other workers' trials may complete it


def say(line: str) -> None:
    print(f"{PROG}: {line}", flush=True)


def active_params(stored: dict[str, Any]) -> dict[str, Any]:
    """A trial's params as the recipe got them (categorical lists and mappings are stored as JSON text)."""
    return {key: choice_value(value) for key, value in stored.items()}


def trial_run_id(client: MlflowClient, experiment: str, study: str, number: int) -> str | None:
    """The MLflow run of trial ``number`` of ``study`` (``None`` when the trial failed before it had one)."""
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], filter_string=(
        f"tags.`loopwise.sweep.study` = '{study}' and tags.`loopwise.sweep.trial` = '{number}'"
        " and tags.`loopwise.stage` = 'fit'"), max_results=1)
    return runs[0].info.run_id if runs else None


def write_best_config(client: MlflowClient, study: optuna.Study, experiment: str, folder: Path, parent: str) -> Path | None:
    """``best.yaml``: the best trial's complete config (its run's ``config.yaml``), beside the study and in the
    parent run."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        return None
    best = study.best_trial
    run_id = trial_run_id(client, experiment, study.study_name, best.number)
    if run_id is None:
        return None
    with tempfile.TemporaryDirectory() as tmp, no_progress_bar():  # one small file: MLflow's bar says nothing
        config = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", tmp)).read_text())
    # the winner trained as an ordinary recipe: its own run name, and its MLflow model (trials skip it); from the
    # start, in a run of its own (a retry's config names the killed trial's checkpoint and the run it branched from)
    logger = (config.get("trainer") or {}).get("logger")
    if isinstance(logger, dict) and isinstance(logger.get("init_args"), dict):
        logger["init_args"]["run_name"] = None
        tags = logger["init_args"].get("tags")
        if isinstance(tags, dict):
            kept = {k: v for k, v in tags.items() if k not in (RESUMED_FROM_TAG, RESUMED_FROM_STEP_TAG)}
            logger["init_args"]["tags"] = kept or None
    config["mlflow_model"] = True
    config["ckpt_path"] = None
    text = yaml.safe_dump(config, sort_keys=False)
    header = (f"# recipes sweep: best trial {best.number} of study {study.study_name!r} ({study.direction.name.lower()} "
              f"{best.value:.6g}), MLflow run {run_id}\n# recipes fit -c best.yaml\n")
    path = folder / "best.yaml"
    path.write_text(header + text)
    client.log_artifact(parent, str(path))
    return path


def run_sweep(options: Namespace, fit_args: list[str], sweep: SweepFile, cfg: Namespace) -> int:
    """Run trials until the study has ``options.n_trials`` (or ``options.timeout`` passes); the exit code."""
    metric, direction = objective_of(cfg, options, sweep)
    experiment, uri = experiment_name(cfg), tracking_uri(cfg)
    storage = options.storage or default_storage()
    name = options.study_name or f"{experiment}-sweep"
    pruner = options.pruner or sweep.pruner or "median"
    seed = cfg.get("seed_everything")
    seed = seed if isinstance(seed, int) and not isinstance(seed, bool) else None
    prepare_sqlite_store(uri, experiment)  # workers starting together on a new mlflow.db take turns creating it
    study, created, rdb = open_study(storage, name, direction, pruner, seed, options.heartbeat_interval or None)
    client = MlflowClient(uri)
    settings = {"study_name": name, "storage": shown_storage(storage), "metric": metric, "direction": direction,
                "pruner": pruner, "sampler": f"TPESampler(seed={seed} + trial number)", "sweep_file": sweep.path}
    parent = create_parent_run(study, uri, experiment, sweep, settings) if created else wait_for_parent_run(name, storage)
    client.update_run(parent, status="RUNNING")
    mark_worker(client, parent, "running")
    say(f"study {name!r} in {shown_storage(storage)}: {direction} {metric}; MLflow parent run {parent} "
        f"(experiment {experiment!r})")
    checkpoints_dir = str(cfg.get("checkpoints_dir") or "checkpoints")
    try:
        with trial_start_lock(storage):
            dead = fail_abandoned_trials(study)
            stale = fail_stale_trials_of_dead_workers(study, rdb)
        settle_dead_workers(client, parent, experiment, checkpoints_dir, dead, always=True, study=study)
        settle_stale_trials(client, study, experiment, stale)
        run_trials(options, fit_args, sweep, study, client, parent, experiment, metric, checkpoints_dir, rdb,
                   cfg.get("trainer.max_epochs"))
    except KeyboardInterrupt as stop:  # Ctrl+C between trials
        close_parent(client, study, storage, parent, "KILLED", experiment, checkpoints_dir)
        raise SIGTERMException() from stop
    except SIGTERMException:
        close_parent(client, study, storage, parent, "KILLED", experiment, checkpoints_dir)
        raise
    except BaseException:
        close_parent(client, study, storage, parent, "FAILED", experiment, checkpoints_dir)
        raise
    announce_trial(None)
    folder = sqlite_path(storage).parent if sqlite_path(storage) else Path.cwd()
    best = write_best_config(client, study, experiment, folder, parent)
    close_parent(client, study, storage, parent, "FINISHED", experiment, checkpoints_dir)
    done = counts(study)
    summary = ", ".join(f"{n} {state}" for state, n in done.items() if n)
    if best is not None:
        say(f"{summary}; best trial {study.best_trial.number}: {metric} {study.best_value:.6g} "
            f"{json.dumps(active_params(study.best_params))}; {best} (recipes fit -c {best})")
        return 0
    say(f"{summary}; no trial completed")
    return 1 if done["complete"] == 0 else 0


def settle_dead_workers(client: MlflowClient, parent: str, experiment: str, checkpoints_dir: str, dead: list[int],
                        always: bool = False, study: optuna.Study | None = None) -> None:
    """What workers killed beside this one left, once their trials ``dead`` are failed in Optuna: said in one line;
    their trials' runs get what their journals hold and end KILLED (``replay_pending``; a run without a journal is
    ended KILLED by ``close_abandoned_runs``); their worker tags on the parent say ``died``. Nothing when ``dead`` is
    empty unless ``always`` (this worker's start and end: a dead run may be left from before)."""
    if dead:
        how = queued_again(study, dead) if study is not None else "queued again with the same values"
        say(f"trial(s) {', '.join(map(str, dead))} were left RUNNING by a worker that no longer exists: failed, and "
            f"{how}")
    if not (dead or always):
        return
    replay_pending(client.tracking_uri, checkpoints_dir)  # their fit runs: their last values, then KILLED
    close_abandoned_runs(client.tracking_uri, experiment)  # the runs without a journal: KILLED
    mark_dead_workers(client, parent)


def close_parent(client: MlflowClient, study: optuna.Study, storage: str, parent: str, status: str,
                 experiment: str, checkpoints_dir: str) -> None:
    """This worker has ended: what dead workers left is settled (``settle_dead_workers``), the parent's counts are
    written from the study, and the parent run ends ``status`` unless another worker is still at work (a live one of
    this host, any of another host) or a trial still runs."""
    mark_worker(client, parent, "ended")
    with trial_start_lock(storage):
        dead = fail_abandoned_trials(study)
    settle_dead_workers(client, parent, experiment, checkpoints_dir, dead, always=True, study=study)
    record_progress(study, client, parent)  # the counts as Optuna holds them now (a trial failed since is counted)
    others = workers_alive(client.get_run(parent).data.tags, socket.gethostname())
    if counts(study)["running"] == 0 and not others:
        client.set_terminated(parent, status=status)


def run_trials(options: Namespace, fit_args: list[str], sweep: SweepFile, study: optuna.Study,
               client: MlflowClient, parent: str, experiment: str, metric: str, checkpoints_dir: str = "checkpoints",
               rdb: RDBStorage | None = None, max_epochs: int | None = None) -> None:
    """Ask, run and tell trials until the study has ``options.n_trials`` COMPLETE trials (or ``options.timeout``
    passes, or as many trials failed): pruned, failed and interrupted trials do not count, and a trial whose worker
    died (on this host: its process is gone; on any host: its heartbeats stopped) is failed and retried first
    (``settle_dead_workers``, ``settle_stale_trials``). While the other workers' running trials would complete the
    study, this worker waits for them rather than start one too many, and takes over if one of them fails. A retry
    trains on from the killed trial's last checkpoint (``retry_link``) unless that is already ``max_epochs`` (the
    fit's ``trainer.max_epochs``, or the trial's swept value) into training."""
    name, direction = study.study_name, study.direction.name.lower()
    started = time.monotonic()
    storage = options.storage or default_storage()
    waited_since: float | None = None
    while True:
        if options.timeout is not None and time.monotonic() - started > options.timeout:
            say(f"--timeout {options.timeout:g} s reached")
            return
        with trial_start_lock(storage):
            dead = fail_abandoned_trials(study)  # a RUNNING trial of a dead worker would hold a place
            stale = fail_stale_trials_of_dead_workers(study, rdb) if rdb is not None else []
            done = counts(study)
            hopeless = why_stop(done, options.n_trials)
            enough = done["complete"] >= options.n_trials or hopeless is not None
            busy = not enough and done["complete"] + done["running"] >= options.n_trials
            if not (enough or busy):
                trial = ask(study)
                claim_trial(trial)  # before anything else can fail: its pid and first heartbeat say who runs it
                trial_id = first_beat(study, rdb, trial.number) if rdb is not None else None
        settle_dead_workers(client, parent, experiment, checkpoints_dir, dead, study=study)
        settle_stale_trials(client, study, experiment, stale)
        if enough:
            if hopeless is not None:
                say(hopeless)
            return
        if busy:  # the others' trials may complete the study: wait a while for them (or for their death)
            interval = rdb.get_heartbeat_interval() if rdb is not None else None
            if interval is None:  # without heartbeats a worker of another host may be dead: nothing to wait for
                return
            if waited_since is None:
                waited_since = time.monotonic()
                say(f"waiting for {done['running']} running trial(s) of other workers (up to "
                    f"{WAIT_INTERVALS * interval} s: one that dies is failed and retried here)")
            elif time.monotonic() - waited_since > WAIT_INTERVALS * interval:
                say("the other workers' trials are still running: this worker ends, they finish the study")
                return
            time.sleep(min(WAIT_S, float(interval)))
            continue
        waited_since = None
        params = {d.key: d.suggest(trial) for d in sweep.dimensions}
        active = ActiveTrial(trial, trial.number, name, parent, metric, direction, params,
                             retry_of=retry_link(client, study, experiment, trial.number, checkpoints_dir,
                                                 params.get("trainer.max_epochs", max_epochs), metric))
        announce_trial(active)
        try:
            with beating(rdb, trial_id, trial.number) if rdb is not None and trial_id is not None else nullcontext():
                state, reason = run_trial(fit_args, active)
        except (SIGTERMException, KeyboardInterrupt) as stop:
            with suppress(UpdateFinishedTrialError):  # failed meanwhile by another worker (its heartbeats late)
                trial.set_user_attr("interrupted", True)
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            if getattr(stop, "code", None) == SIGNAL_EXIT_CODES["SIGUSR1"]:  # SLURM's pre-kill signal: run it again
                retry(study, frozen_trial(study, trial.number), max_retry=None)
            run_id = trial_run_id(client, experiment, name, trial.number)
            if run_id:
                client.set_tag(run_id, "loopwise.sweep.failure", "interrupted")
            record_progress(study, client, parent)
            if isinstance(stop, KeyboardInterrupt):
                raise SIGTERMException() from stop
            raise
        except BaseException:  # anything else that ends this worker: its trial does not stay RUNNING
            study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
            raise
        record_trial(study, client, trial, active, state, reason, experiment)
        record_progress(study, client, parent)


def why_stop(done: dict[str, int], n_trials: int) -> str | None:
    """Why a study short of ``n_trials`` complete trials starts no more (``None``: it goes on): as many failures as
    ``n_trials``; none of the first ``n_trials`` completed (all pruned or failed: the search space or the pruner
    leaves nothing to complete); or ``MAX_TRIALS_FACTOR`` times ``n_trials`` trials finished."""
    finished = done["complete"] + done["pruned"] + done["failed"]
    if done["complete"] >= n_trials:
        return None
    if done["failed"] >= n_trials:
        return f"{done['failed']} trials failed, as many as --n_trials: stopping (see their failures)"
    if done["complete"] == 0 and finished >= n_trials:
        return (f"none of the first {finished} trials completed ({done['pruned']} pruned, {done['failed']} failed): "
                "stopping (see the pruner and the search space)")
    if finished >= MAX_TRIALS_FACTOR * n_trials:
        return (f"{finished} trials finished, {MAX_TRIALS_FACTOR}x --n_trials, {done['complete']} of them complete: "
                "stopping")
    return None


NO_CHECKPOINT = "the killed trial left no checkpoint"


def retry_link(client: MlflowClient, study: optuna.Study, experiment: str, number: int,
               checkpoints_dir: str = "checkpoints", max_epochs: int | None = None, metric: str | None = None,
               ) -> RetryOf | None:
    """For a trial that retries one whose worker died (or was preempted): that trial (the one right before in a chain
    of retries), its MLflow run, the last checkpoint to train on from (``last_checkpoint_of``: that trial's, else,
    when it was killed before its first, the newest an earlier trial of the chain left) and the objective's values
    up to there (``metric``'s history in that run, and the values that trial reported to Optuna), said in one line;
    ``None`` for a new trial."""
    chain = retry_chain(study, number)
    if not chain:
        return None
    killed = chain[-1]
    run_id = trial_run_id(client, experiment, study.study_name, killed)
    checkpoint, why_not, source, source_run = None, "the killed trial left no run", killed, run_id
    for earlier in reversed(chain):
        earlier_run = run_id if earlier == killed else trial_run_id(client, experiment, study.study_name, earlier)
        if earlier_run is None:
            continue
        found, reason = last_checkpoint_of(client, earlier_run, experiment, checkpoints_dir, max_epochs)
        why_not = reason if earlier == killed else why_not
        if found:
            checkpoint, source, source_run = found, earlier, earlier_run
        if found or reason != NO_CHECKPOINT:  # a checkpoint that cannot be used: the chain's older ones neither
            break
    reported = {int(step): float(value) for step, value in frozen_trial(study, source).intermediate_values.items()}
    history: list[tuple[int, float]] = []
    if checkpoint and metric and source_run:
        with suppress(Exception):  # the store out of reach: Optuna's values (one per epoch) stand in
            history = [(m.step, m.value) for m in client.get_metric_history(source_run, metric)]
    whose = "that run's" if source == killed else f"trial {source}'s (the killed trial saved none of its own)"
    say(f"trial {number} retries trial {killed} (its worker died) with the same values"
        + (f"; the killed trial's run: {run_id}" if run_id else "")
        + (f"; it trains on from {whose} last checkpoint ({checkpoint})" if checkpoint
           else f"; from the start ({why_not})"))
    return RetryOf(killed, run_id, checkpoint, reported, history)


def last_checkpoint_of(client: MlflowClient, run_id: str, experiment: str, checkpoints_dir: str,
                       max_epochs: int | None = None) -> tuple[str | None, str]:
    """(``run:<run id>/last``, "") when run ``run_id`` left a ``last.ckpt`` a retry can train on from: in this
    machine's checkpoint folder, unless a live process still trains that run (its worker was taken for dead when
    its heartbeats stopped) or the file is already ``max_epochs`` into training (the sweep's command now trains
    fewer epochs than the killed trial did: the retry starts over within the command's budget); or uploaded to the
    store (a worker of another host). Else (``None``, why not: ``NO_CHECKPOINT`` when there is none)."""
    experiment_dir = Path(checkpoints_dir) / experiment
    holder = run_lock_holder(experiment_dir, run_id)
    if holder is not None:
        return None, f"its run is still being trained by {holder}"
    local = experiment_dir / run_id / "last.ckpt"
    if local.is_file():
        with suppress(Exception):  # unreadable here: the fit's own check of the checkpoint says what is wrong
            epoch = int(torch.load(local, map_location="cpu", weights_only=True, mmap=True)["epoch"])
            if max_epochs is not None and max_epochs >= 0 and epoch >= max_epochs:
                return None, f"its last checkpoint is from epoch {epoch}, the command trains {max_epochs} epochs"
        return f"run:{run_id}/last", ""
    with suppress(Exception):  # an artifact store out of reach: the retry starts from scratch, as without one
        if any(Path(a.path).name == "last.ckpt" for a in client.list_artifacts(run_id, CHECKPOINT_ARTIFACT_DIR)):
            return f"run:{run_id}/last", ""
    return None, NO_CHECKPOINT


def fail_stale_trials_of_dead_workers(study: optuna.Study, rdb: RDBStorage) -> list[int]:
    """``heartbeat.fail_stale_trials``, and the trials it failed kept as interrupted (hold ``trial_start_lock``)."""
    stale = fail_stale_trials(study, rdb)
    if stale:
        record_abandoned(study, stale)
    return stale


def settle_stale_trials(client: MlflowClient, study: optuna.Study, experiment: str, stale: list[int]) -> None:
    """Trials failed because their worker's heartbeats stopped (any host; ``fail_stale_trials_of_dead_workers``,
    which also queued them again and counted them as interrupted): said in one line, their runs ended KILLED."""
    if not stale:
        return
    say(f"trial(s) {', '.join(map(str, stale))} stopped sending heartbeats (their worker died): failed, and "
        f"{queued_again(study, stale)}")
    for number in stale:
        run_id = trial_run_id(client, experiment, study.study_name, number)
        if run_id and client.get_run(run_id).info.status == "RUNNING":
            client.set_tag(run_id, "loopwise.sweep.failure", "its worker stopped sending heartbeats")
            client.set_tag(run_id, "loopwise.abandoned", "heartbeat")
            client.set_terminated(run_id, status="KILLED")


def record_trial(study: optuna.Study, client: MlflowClient, trial: optuna.Trial, active: ActiveTrial,
                 state: TrialState, reason: str | None, experiment: str) -> None:
    """Tell the study a trial's outcome and mark its run (pruned: KILLED; failed: FAILED, with the reason)."""
    run_id = trial_run_id(client, experiment, study.study_name, trial.number)
    params = json.dumps(active.params)
    if state == TrialState.COMPLETE:
        study.tell(trial, active.best_value(), skip_if_finished=True)
        say(f"trial {trial.number}: {active.metric} {active.best_value():.6g}  {params}")
    elif state == TrialState.PRUNED:
        study.tell(trial, state=TrialState.PRUNED, skip_if_finished=True)
        if run_id:
            client.set_tag(run_id, "loopwise.sweep.pruned", str(reason))
            client.set_terminated(run_id, status="KILLED")
        say(f"trial {trial.number}: pruned at {reason}  {params}")
    else:
        with suppress(UpdateFinishedTrialError):
            trial.set_user_attr("failure", str(reason))
        study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)
        if run_id:
            client.set_tag(run_id, "loopwise.sweep.failure", str(reason)[:5000])
            if client.get_run(run_id).info.status == "RUNNING":
                client.set_terminated(run_id, status="FAILED")
        say(f"trial {trial.number}: failed: {reason}")


__all__ = ["close_parent", "fail_stale_trials_of_dead_workers", "last_checkpoint_of", "record_trial", "retry_link",
           "run_sweep", "run_trials", "settle_dead_workers", "settle_stale_trials", "trial_run_id", "why_stop",
           "write_best_config"]
