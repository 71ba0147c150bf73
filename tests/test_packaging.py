"""What users and stored files name keeps working (issue 29, item 7): the import paths the README names import, and a
built wheel (not only the editable install) holds every package of the project and the MLflow model's code."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("recipes", "lightning_modules", "datamodules")
#: a dotted name in backticks, or the module of a ``from X import Y`` line, of one of the packages
DOTTED = re.compile(r"`((?:recipes|lightning_modules|datamodules)(?:\.[A-Za-z_]\w*)+)`")
FROM_IMPORT = re.compile(r"\bfrom ((?:recipes|lightning_modules|datamodules)(?:\.\w+)*) import (\w+(?:, \w+)*)")


def readme_names() -> set[str]:
    """The names the README and the documentation pages give users."""
    text = "\n".join(path.read_text() for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))])
    names = {name for name in DOTTED.findall(text) if not name.endswith((".py", ".yaml"))}
    for module, imported in FROM_IMPORT.findall(text):
        names |= {f"{module}.{name.strip()}" for name in imported.split(",") if name.strip()}
    names |= {"recipes.tracking.RecipeLogger", "recipes.cli.main"}  # stored in every config.yaml; the entry point
    return names


def resolve(dotted: str) -> object:
    """The module or attribute a dotted name stands for: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(dotted)


def test_the_readme_names_import_paths():
    assert len(readme_names()) >= 8, sorted(readme_names())


@pytest.mark.parametrize("name", sorted(readme_names()))
def test_an_import_path_the_readme_names_imports(name):
    resolve(name)


@pytest.mark.parametrize(
    "shim, names",
    [
        ("recipes.checkpoint_files", ["load_checkpoint_weights_only"]),  # imported by every logged model's code
        ("recipes.predictions", ["predict_frame"]),  # imported by every logged model's code
        ("recipes.tracking", ["RecipeLogger"]),  # the class path in every config.yaml and best.yaml
        ("recipes.loop_doctor", ["LoopDoctor", "LoopDoctorWarning"]),
        ("recipes.callbacks", ["TrainingPlan", "LoopDoctor"]),
        ("recipes.loader_resume", ["LoaderPositionOnResume"]),
        ("recipes.checkpoint_io", ["AtomicCheckpointIO"]),
    ],
)
def test_the_old_import_paths_stored_files_and_users_name_still_import(shim, names):
    module = importlib.import_module(shim)
    for name in names:
        assert hasattr(module, name), f"{shim}.{name}"


def project_packages() -> list[str]:
    """Every folder of the packages with an ``__init__.py``, as a path inside the wheel."""
    return sorted(str(p.parent.relative_to(REPO)) for pkg in PACKAGES for p in (REPO / pkg).rglob("__init__.py"))


@pytest.mark.slow
def test_a_built_wheel_holds_every_package_and_the_model_code(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path),
         str(REPO)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("loopwise-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [f"{package}/__init__.py" for package in project_packages() if f"{package}/__init__.py" not in names]
    modules = [str(p.relative_to(REPO)) for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    missing += [module for module in modules if module not in names]
    assert "recipes/predict/pyfunc_model.py" in names
    assert not missing, f"the wheel {wheel.name} lacks: {missing}"
