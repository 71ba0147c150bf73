"""The diagnostic callbacks every recipe gets: the training plan and the loop doctor.

``from recipes.callbacks import TrainingPlan, LoopDoctor``. Both work with a plain ``lightning.Trainer``.
"""

from recipes.doctor import Finding, LoopDoctor, LoopDoctorWarning, NonFiniteError, ScheduleError
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
