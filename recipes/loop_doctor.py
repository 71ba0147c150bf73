"""The names ``recipes.loop_doctor`` always had; the loop doctor itself lives in ``recipes.doctor``, one module per
check."""

from recipes.doctor.findings import CHECKS, TAG_LIMIT, Finding, LoopDoctorWarning
from recipes.doctor.initial_loss import is_multiclass_module
from recipes.doctor.loop_doctor import LoopDoctor
from recipes.doctor.non_finite import NonFiniteError
from recipes.doctor.sample_hashing import sample_hashes
from recipes.doctor.schedule import LENGTH_ATTRIBUTES, ScheduleError
from recipes.doctor.train_eval_mode import mode_modules, modules_in_train_mode

__all__ = [
    "CHECKS",
    "LENGTH_ATTRIBUTES",
    "TAG_LIMIT",
    "Finding",
    "LoopDoctor",
    "LoopDoctorWarning",
    "NonFiniteError",
    "ScheduleError",
    "is_multiclass_module",
    "mode_modules",
    "modules_in_train_mode",
    "sample_hashes",
]
