"""The rooms of DESIGN.md: lightning_modules and datamodules stand alone."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    "package, forbidden",
    [("lightning_modules", {"recipes", "datamodules", "mlflow"}), ("datamodules", {"recipes", "lightning_modules", "mlflow"})],
)
def test_packages_do_not_import_their_neighbours(package, forbidden):
    for path in sorted((REPO / package).rglob("*.py")):
        bad = imported_packages(path) & forbidden
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_public_names_of_the_design_import():
    from datamodules import (  # noqa: F401
        CharLMDataModule,
        ImageFolderDataModule,
        SpiralDataModule,
        TextClassificationDataModule,
    )
    from datamodules.collate import pad_collate  # noqa: F401
    from datamodules.samplers import ClassBalancedSampler, LengthBucketBatchSampler  # noqa: F401
    from lightning_modules import ClassificationModule, LanguageModelModule, RegressionModule  # noqa: F401
    from lightning_modules.models import GPT, MLP, ConvNet, TransformerClassifier  # noqa: F401
    from lightning_modules.optim import Constant, OneCycle, Plateau, WarmupCosine  # noqa: F401
    from recipes.cli import main  # noqa: F401
