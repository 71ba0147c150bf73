"""The documentation's "Bad input" table (docs/reference/bad-input.md) stays honest: every row names at least one test, and every named test exists."""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

TEST_REF = re.compile(r"`(tests/[\w/]+\.py::\w+(?:\[[^\]`]+\])?)`")


def catalogue_rows() -> list[tuple[str, list[str]]]:
    """``(input, [test ids])`` of every row of the "Bad input" page's table."""
    text = (REPO / "docs" / "reference" / "bad-input.md").read_text()
    section = text.split("# Bad input", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        if not line.startswith("|") or line.startswith("|---") or line.startswith("| input |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append((cells[0], TEST_REF.findall(cells[-1])))
    return rows


def test_every_row_names_a_test():
    rows = catalogue_rows()
    assert len(rows) >= 24
    assert [row for row, tests in rows if not tests] == []
    inputs = " ".join(row for row, _ in rows)
    for topic in ("truncated", "not a PyTorch file", "not a Lightning checkpoint", "pickle", "another recipe"):
        assert topic in inputs  # the checkpoint rows


def test_every_named_test_exists():
    """Each named function is defined in its file; a ``[param]`` id is made of string literals of that file (the ids
    of the parametrized tests come from them). Parsing, not collecting: collection would import everything."""
    missing = []
    for _, tests in catalogue_rows():
        for test in tests:
            path, name = test.split("::")
            function, _, param = name.partition("[")
            tree = ast.parse((REPO / path).read_text())
            defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
            literals = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)}
            if function not in defined:
                missing.append(test)
            elif param:
                param_id = param.rstrip("]")
                if not (param_id in literals or all(part in literals for part in param_id.split("-"))):
                    missing.append(test)
    assert missing == [], f"docs/reference/bad-input.md names tests that do not exist: {missing}"
