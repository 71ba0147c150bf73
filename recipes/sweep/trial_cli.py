"""``TrialCLI``: the ``recipes fit`` of one sweep trial, and ``run_trial``, which runs it and reads its outcome.

A trial is an ordinary recipe fit with the trial's sampled values appended to its arguments, run in the sweep's
process through ``TrialCLI``, the ``RecipesCLI`` subclass built with the trial (``ActiveTrial``). It adds, through
``RecipesCLI``'s extension points, what makes the fit a trial: the trial's tags (``extra_run_tags``:
``loopwise.sweep.*`` and ``mlflow.parentRunId``, which nests its MLflow run under the sweep's parent run) and its
``TrialPruning`` callback (``extra_callbacks``); before the fit starts, the trial's swept values become params of
its run (``before_fit``: ``sweep.<key>``, ``ActiveTrial.run_params``). A plain ``RecipesCLI`` knows nothing of
sweeps: a fit after the sweep in the same process gets neither.

Rank 0 (``recipes.sweep.runner``) and the DDP processes that follow it (``recipes.sweep.processes``) run trials here.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.exceptions import SIGTERMException
from optuna.trial import TrialState

from recipes.checkpoints.run_lock import release_run_locks
from recipes.run.errors import RecipeInputError
from recipes.run.recipes_cli import RecipesCLI
from recipes.callbacks.trial_pruning import TrialPruning
from recipes.sweep.space import as_cli_value
from recipes.sweep.trial import ActiveTrial
from recipes.tracking.tracked_run import tracked_run


class TrialCLI(RecipesCLI):
    """``RecipesCLI`` for the fit of one sweep trial: the trial's run tags and its pruning callback.

    Args:
        trial: The trial this fit runs for (its MLflow run's tags, the objective the pruning callback reports).
        args: The fit's arguments (``["fit", ...]``), as for ``RecipesCLI``.
        run: Run the subcommand (as for ``RecipesCLI``).
    """

    def __init__(self, trial: ActiveTrial, args: list[str], run: bool = True) -> None:
        self.trial = trial
        super().__init__(args=args, run=run)

    def extra_run_tags(self) -> dict[str, str]:
        """The trial's tags (study, number, params; the parent run), on its fit's run."""
        return self.trial.tags() if self.subcommand == "fit" else {}

    def resumes_requeued_job(self) -> bool:
        """No: a trial in a requeued SLURM job is a trial of its own (the study queued the stopped one again)."""
        return False

    def resumes_in_new_run(self) -> bool:
        """A retry of a killed trial trains on from that trial's last checkpoint in a run of its own (the retry's
        trial number and tags), linked to the killed run and holding its history before the checkpoint."""
        return self.trial.retry_of is not None

    def extra_callbacks(self) -> list[Callback]:
        """The trial's ``TrialPruning`` callback, in its fit."""
        return [TrialPruning(self.trial)] if self.subcommand == "fit" else []

    def before_fit(self) -> None:
        """The trial's swept values as params of its run (``ActiveTrial.run_params``), written once before training
        by the process that holds the Optuna trial (rank 0; DDP followers hold none)."""
        run = tracked_run(self.trainer)
        if run is not None and self.trial.trial is not None:
            run.log_params_once(self.trial.run_params())


def trial_arguments(fit_args: list[str], active: ActiveTrial) -> list[str]:
    """The trial's ``recipes fit`` arguments: the sweep's, its run name, its sampled values; for a retry of a killed
    trial that left a checkpoint, that checkpoint (``--ckpt_path run:<run id>/last``)."""
    resume = active.retry_of.checkpoint if active.retry_of is not None else None
    return ["fit", *fit_args, f"--trainer.logger.init_args.run_name={active.run_name}",
            *[f"--{key}={as_cli_value(value)}" for key, value in active.params.items()],
            *([f"--ckpt_path={resume}"] if resume else [])]


def run_trial(fit_args: list[str], active: ActiveTrial) -> tuple[TrialState, str | None]:
    """Run one trial's recipe fit; (its state, why it failed or was pruned)."""
    try:
        TrialCLI(active, args=trial_arguments(fit_args, active))
    except (SIGTERMException, KeyboardInterrupt):
        raise
    except RecipeInputError as err:
        return TrialState.FAIL, f"the values do not make a recipe: {err}"
    except Exception as err:  # noqa: BLE001 - any failure of a trial is that trial's, the sweep goes on
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return TrialState.FAIL, f"{type(err).__name__}: {first}"[:500]
    finally:
        release_run_locks()  # the trial's run may be resumed once its fit is over
    if active.pruned_at is not None:
        return TrialState.PRUNED, active.pruned_at
    if active.best_value() is None:
        return TrialState.FAIL, f"no finite value of {active.metric} was logged"
    return TrialState.COMPLETE, None


__all__ = ["TrialCLI", "run_trial", "trial_arguments"]
