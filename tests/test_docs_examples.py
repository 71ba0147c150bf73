"""Issue 57: the Python examples of the README and the documentation pages run as shown, each in a fresh interpreter
in an empty directory, so none rots. An example that cannot run here says why in a comment just above it:
``<!-- docs-test: skip: <reason> -->`` (the reason names the test that runs its lines where there is one)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BLOCK = re.compile(r"(<!-- docs-test: skip: (?P<reason>[^>]+?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def examples() -> list[tuple[str, str, str | None]]:
    """``(page:line, code, skip reason or None)`` of every ```python block."""
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start("code")].count("\n")
            found.append((f"{page.relative_to(REPO)}:{line}", match.group("code"), match.group("reason")))
    return found


EXAMPLES = examples()


def test_the_pages_hold_python_examples_and_every_skip_names_its_reason():
    assert len(EXAMPLES) >= 2
    for where, _, reason in EXAMPLES:
        if reason is not None:
            assert len(reason.strip()) > 10, where
            for test in re.findall(r"tests/[\w/]+\.py", reason):
                assert (REPO / test).is_file(), f"{where}: {test}"


@pytest.mark.slow  # each example trains or loads as a user would (the spiral example: 40 epochs, about 20 s)
@pytest.mark.parametrize("where,code,reason", EXAMPLES, ids=[where for where, _, _ in EXAMPLES])
def test_a_python_example_runs_as_shown(where: str, code: str, reason: str | None, tmp_path: Path):
    if reason is not None:
        pytest.skip(reason)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{where}:\n{done.stderr[-3000:]}"
