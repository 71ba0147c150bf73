"""Data modules and tasks take their base's arguments as ``**kwargs``: ``--data.help``/``--model.help`` still list
every one of them, with the base's documentation, type and default, and the saved hyperparameters are the options.

jsonargparse finds the arguments that ``**kwargs`` stands for by reading the ``super().__init__(...)`` call; these
tests fail when a subclass hides them (e.g. by reading ``kwargs`` itself) or when its docstring forgets to say whose
they are. Help only, no training.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from docstring_parser import parse

import datamodules
import lightning_modules
from datamodules import BaseDataModule
from lightning_modules.task import Task
from recipes.cli import main

REPO = Path(__file__).resolve().parents[2]
# the data modules datamodules exports (not its other public classes, such as BatchAugmentation)
DATA_MODULES = [
    cls for cls in (getattr(datamodules, name) for name in datamodules.__all__)
    if isinstance(cls, type) and issubclass(cls, BaseDataModule) and cls is not BaseDataModule
]
TASKS = [lightning_modules.ClassificationModule, lightning_modules.RegressionModule, lightning_modules.LanguageModelModule]


def help_text(kind: str, class_name: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What ``recipes fit --<kind>.help <class_name>`` prints."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop:
        main(["fit", f"--{kind}.help", class_name])
    assert stop.value.code in (0, None)
    return capsys.readouterr().out


def options(help_out: str, kind: str) -> dict[str, str]:
    """Each ``--<kind>.<name>`` option of a help text and its block (description, type, default), on one line."""
    blocks = re.split(r"\n  (?=--)", help_out)
    found = {}
    for block in blocks[1:]:
        flag = block.split()[0]
        if flag.startswith(f"--{kind}.") and flag.count(".") == 1:
            found[flag.split(".", 1)[1]] = " ".join(block.split())
    return found


def squeezed(text: str) -> str:
    """``text`` without whitespace: help wraps lines (also after hyphens) where the docstring does not."""
    return re.sub(r"\s+", "", text)


def documented(cls: type) -> dict[str, str]:
    """The ``Args:`` descriptions of a class docstring."""
    return {param.arg_name: param.description or "" for param in parse(inspect.getdoc(cls) or "").params}


def type_and_default(block: str) -> str:
    """The ``(type: ..., default: ...`` part of an option's block (without the known subclasses, which depend on
    what has been imported so far)."""
    match = re.search(r"\(type: .*?(?=, known subclasses: |\)$)", block)
    assert match, block
    return match.group(0)


def base_parameters(base: type) -> list[str]:
    return [name for name in inspect.signature(base.__init__).parameters if name != "self"]


def own_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The parameters a subclass names itself (not those behind its ``**kwargs``)."""
    return {
        name: p
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.kind is not p.VAR_KEYWORD
    }


def shown(value: Any) -> str:
    """A default as jsonargparse's help writes it."""
    return "null" if value is None else str(value)


CASES = [("data", cls, BaseDataModule) for cls in DATA_MODULES] + [("model", cls, Task) for cls in TASKS]


@pytest.mark.parametrize("kind, cls, base", CASES, ids=[cls.__name__ for _, cls, _ in CASES])
def test_help_lists_every_base_option_with_its_documentation(kind, cls, base, capsys):
    base_help = options(help_text(kind, base.__name__, capsys), kind)
    sub_help = options(help_text(kind, cls.__name__, capsys), kind)
    base_docs, sub_docs = documented(base), documented(cls)
    own = own_parameters(cls)
    fixed = set(getattr(cls, "fixed_arguments", ()))
    for name in base_parameters(base):
        if name in fixed:  # set by the subclass in its super().__init__() call: not an option of its own
            assert name not in sub_help, f"{cls.__name__} fixes {name} but --{kind}.help lists it"
            continue
        assert name in sub_help, f"--{kind}.help {cls.__name__} does not list {name}"
        block = sub_help[name]
        # the subclass's own words where it names the argument itself (its default differs), the base's otherwise
        description = sub_docs.get(name) if name in own else base_docs.get(name)
        assert description, f"{name} has no documentation for {cls.__name__}"
        assert squeezed(description)[:60] in squeezed(block), f"{cls.__name__}.{name}: {block!r}"
        if name in own:
            default = own[name].default
            if default is not inspect.Parameter.empty:
                assert f"default: {shown(default)}" in block, f"{cls.__name__}.{name}: {block!r}"
        else:
            assert type_and_default(block) == type_and_default(base_help[name]), f"{cls.__name__}.{name}"


@pytest.mark.parametrize("kind, cls, base", CASES, ids=[cls.__name__ for _, cls, _ in CASES])
def test_class_docstring_says_whose_the_other_arguments_are(kind, cls, base):
    doc = inspect.getdoc(cls) or ""
    assert f"``{base.__name__}``'s" in doc and "**kwargs" in doc, cls.__name__


def build(cls: type, tmp_path: Path) -> Any:
    """A data module built in Python with only its required arguments."""
    if cls is datamodules.ImageFolderDataModule:
        from PIL import Image

        for label in ("a", "b"):
            (tmp_path / label).mkdir()
            Image.new("RGB", (4, 4)).save(tmp_path / label / "0.png")
        return cls(str(tmp_path))
    required = {
        datamodules.TabularDataModule: {"path": str(REPO / "data" / "churn.csv"), "target": "churn"},
        datamodules.TextClassificationDataModule: {"path": str(REPO / "data" / "reviews.csv")},
        datamodules.CharLMDataModule: {"path": str(REPO / "data" / "tiny_corpus.txt")},
    }
    return cls(**required.get(cls, {}))


@pytest.mark.parametrize("cls", DATA_MODULES, ids=[cls.__name__ for cls in DATA_MODULES])
def test_saved_hyperparameters_are_the_options_with_their_values(cls, tmp_path, capsys):
    listed = options(help_text("data", cls.__name__, capsys), "data")
    module = build(cls, tmp_path)
    assert set(module.hparams) == set(listed)
    default_batch = 256 if cls is datamodules.SyntheticDataModule else 64
    assert module.hparams["batch_size"] == module.batch_size == default_batch
    rebuilt = cls(**module.hparams)  # what load_from_checkpoint does
    assert dict(rebuilt.hparams) == dict(module.hparams)
