"""The loop doctor: the seeds' silent training-loop bugs made loud.

``LoopDoctor`` (``recipes.doctor.loop_doctor``) is one callback with one switch per check; each check is also a
callback of its own, usable alone in ``Trainer(callbacks=[...])``:

- ``initial_loss`` (``InitialLossCheck``): the first batch's loss vs the value the task expects at initialization,
  ln(C) for a freshly initialized classifier over C classes (001's debugging table: "for CrossEntropyLoss with C
  classes, loss ≈ log(C) at initialization"); the task says what it expects (``Task.expected_initial_loss``).
- ``non_finite`` (``NonFiniteCheck``): a NaN/inf loss or gradient stops the run before the optimizer step, naming
  the global step, the batch and the first parameter with a non-finite gradient (001's ``check_nan``); the run's
  checkpoints keep the last good weights and an MLflow run ends FAILED with the reason in the tag ``doctor.failure``.
- ``grad_norm`` (``GradientNormCheck``): the total gradient norm before clipping, logged every N steps as
  ``doctor/grad_norm``; a warning when it stays at >= 5x ``gradient_clip_val`` (001: "your learning rate is likely
  too high").
- ``data_wait`` (``DataWaitCheck``): the fraction of step time spent waiting for the next batch, logged per epoch as
  ``doctor/data_wait_fraction``, with a hint when it passes 30%.
- ``leakage`` (``LeakageCheck``): train and val samples hashed (``sample_hashing``); val samples identical to a train
  sample are counted (the run tag ``loopwise.val_train_overlap``) and reported.
- ``schedule`` (``ScheduleCheck``): a per-step LR schedule stepped per epoch (002: the LR moves ``len(loader)``
  times too slowly) is an error before training starts; so is a ``ReduceLROnPlateau`` whose monitor is never logged
  (checked at the end of the first epoch with a validation, before Lightning steps the scheduler).
- ``mode`` (``TrainEvalModeCheck``): validation must run with every module in eval mode and training must resume
  with the modules that trained before back in train mode (002: "the model trains in eval mode without error").
- ``unused_parameters`` (``UnusedParametersCheck``): trainable parameters without a gradient at the first optimizer
  step (the loss never reaches them, so they never change); frozen parameters are left alone.
- ``baseline`` (``TrivialBaselineCheck``): the last validation's accuracy or RMSE against the trivial predictor's
  (the train split's majority class or mean) on the same rows, and ``val/acc`` monitored on a table where one class
  dominates (issue 55: 0.862 accuracy under a 0.880 majority class went unnoticed).

Every finding is kept in ``findings``, warned (``LoopDoctorWarning``) and, with an MLflow logger, set as the run tag
``doctor.<check>`` (``findings.FindingsReporter``).
"""

from recipes.doctor.base import DoctorCheck, DoctorPart
from recipes.doctor.current_step import CurrentStep, StepCheck
from recipes.doctor.data_wait import DataWaitCheck
from recipes.doctor.findings import CHECKS, Finding, FindingsReporter, LoopDoctorWarning
from recipes.doctor.gradient_norm import GradientNormCheck
from recipes.doctor.initial_loss import InitialLossCheck
from recipes.doctor.leakage import LeakageCheck
from recipes.doctor.loop_doctor import LoopDoctor
from recipes.doctor.non_finite import NonFiniteCheck, NonFiniteError
from recipes.doctor.sample_hashing import sample_hashes
from recipes.doctor.schedule import ScheduleCheck, ScheduleError
from recipes.doctor.train_eval_mode import TrainEvalModeCheck
from recipes.doctor.trivial_baseline import TrivialBaselineCheck
from recipes.doctor.unused_parameters import UnusedParametersCheck

__all__ = [
    "CHECKS",
    "CurrentStep",
    "DataWaitCheck",
    "DoctorCheck",
    "DoctorPart",
    "Finding",
    "FindingsReporter",
    "GradientNormCheck",
    "InitialLossCheck",
    "LeakageCheck",
    "LoopDoctor",
    "LoopDoctorWarning",
    "NonFiniteCheck",
    "NonFiniteError",
    "ScheduleCheck",
    "ScheduleError",
    "StepCheck",
    "TrainEvalModeCheck",
    "TrivialBaselineCheck",
    "UnusedParametersCheck",
    "sample_hashes",
]
