"""loopwise's own warnings print as one `recipes: warning:` line; every other warning keeps its format (issue 31,
point 8)."""

from __future__ import annotations

import warnings
from pathlib import Path

import recipes.callbacks.training_plan as training_plan
from recipes.callbacks.training_plan import TrainingPlanWarning
from recipes.tracking.warning_lines import one_line, one_line_warnings


def shown(message: str, category: type, filename: str) -> str:
    one_line_warnings()
    return warnings.formatwarning(message, category, filename, 12, "warnings.warn(...)")


def test_a_training_plan_warning_is_one_line_without_a_file_path():
    text = "TrainingPlan: the loop took 21 optimizer steps in epoch 1, the plan said 22"
    assert shown(text, TrainingPlanWarning, training_plan.__file__) == f"recipes: warning: {text}\n"
    assert warnings.formatwarning is one_line


def test_a_plain_warning_raised_from_loopwise_files_is_one_line_too():
    import datamodules.tabular as tabular

    text = "TabularDataModule: column 'age' holds mostly numbers but also 'n/a' (row 3), so it is treated as categorical"
    assert shown(text, UserWarning, tabular.__file__) == f"recipes: warning: {text}\n"


def test_a_warning_from_the_users_code_keeps_its_file_and_category(tmp_path):
    user_file = str(Path(tmp_path) / "my_models.py")
    line = shown("my model: this batch was not normalised", UserWarning, user_file)
    assert line.startswith(f"{user_file}:12: UserWarning: my model: this batch was not normalised")
    assert "recipes: warning" not in line


def test_installing_twice_changes_nothing():
    one_line_warnings()
    plain = one_line.plain  # type: ignore[attr-defined]
    one_line_warnings()
    assert warnings.formatwarning is one_line and one_line.plain is plain  # type: ignore[attr-defined]
