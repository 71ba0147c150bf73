"""The diagnostic callbacks every recipe gets: the training plan and the loop doctor.

``from recipes.callbacks import TrainingPlan, LoopDoctor``. Both work with a plain ``lightning.Trainer``.
"""

from recipes.doctor.findings import Finding, LoopDoctorWarning
from recipes.doctor.loop_doctor import LoopDoctor
from recipes.doctor.non_finite import NonFiniteError
from recipes.doctor.schedule import ScheduleError
from recipes.callbacks.training_plan import TrainingPlan, TrainingPlanFigures, TrainingPlanWarning, plan_training

__all__ = [
    "Finding",
    "LoopDoctor",
    "LoopDoctorWarning",
    "NonFiniteError",
    "ScheduleError",
    "TrainingPlan",
    "TrainingPlanFigures",
    "TrainingPlanWarning",
    "plan_training",
]
