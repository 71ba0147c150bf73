"""The documentation site (issue 57): `mkdocs build --strict` builds it with no warning (a broken link, a missing
snippet, a docstring mkdocstrings cannot read), every page is in the navigation, the README is a front page of at
most 400 lines, the `recipes --help` text the reference shows is the command's own, and the commands the pages show
name configs that exist and subcommands that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

DOCS = REPO / "docs"


def nav_pages(nav: list) -> set[str]:
    found: set[str] = set()
    for item in nav:
        for value in item.values() if isinstance(item, dict) else [item]:
            found |= nav_pages(value) if isinstance(value, list) else {value}
    return found


def test_the_site_builds_strictly_with_no_warning(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert not [line for line in done.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))], done.stderr
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "TabularDataModule" in api and "batch_size" in api  # the docstrings, arguments included
    first_fit = (tmp_path / "site" / "tutorials" / "first-fit" / "index.html").read_text()
    assert "Training plan" in first_fit  # the README's section, included rather than copied


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text().replace("!!python", "#"))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages == nav_pages(config["nav"])


def test_the_readme_is_a_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (REPO / page).is_file(), page


def test_the_cli_reference_shows_the_commands_own_help():
    done = subprocess.run([sys.executable, "-m", "recipes", "--help"], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.stdout == (DOCS / "reference" / "recipes_help.txt").read_text()


def test_the_commands_the_pages_show_name_existing_configs_and_subcommands():
    from recipes.cli import COMMAND_NAMES

    shown = 0
    for page in [REPO / "README.md", *DOCS.rglob("*.md")]:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
            for line in block.splitlines():
                match = re.match(r"\s*recipes (\w+)", line)
                if not match:
                    continue
                shown += 1
                assert match.group(1) in COMMAND_NAMES, f"{page.name}: {line}"
                for config in re.findall(r"-c (configs/\S+\.yaml)", line):
                    assert (REPO / config).is_file(), f"{page.name}: {line}"
    assert shown >= 30
