"""Issue 57: the command blocks (```bash) of the README and the documentation pages run as shown, so none rots.

Each page's blocks run in page order, as a reader follows the page, with ``bash -e`` in one working directory per page
that holds the repository's ``configs/`` and ``data/`` (read-only links) and the reader's own files. A comment just
above a block says what the block needs or why it cannot run here:

- ``<!-- docs-test: given: NAME ... -->``: what the reader has before the block (``GIVENS`` below makes each: a
  table of their own, a finished spiral run, a running tracking server, ...). ``<run id>`` in the block is the newest
  finished run of the directory's store. With ``tracking-server``, the page's ``mlflow server`` line is the server
  the test started (the fixture's), and ``http://127.0.0.1:5000`` is its address.
- ``<!-- docs-test: skip: REASON -->``: a block that cannot run here (a GPU, a cluster, a download, a command that
  serves until stopped); the reason names the test that runs its lines where there is one. The README's
  ``<!-- ci: setup -->`` and ``<!-- ci: test -->`` blocks are run by CI itself (``.ci/run``).

A page whose blocks train (``recipes fit``, ``sweep``, ...) is in the slow tier.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import REPO
from tests.mlflow_server import server  # noqa: F401  (server: the fixture a page's tracking-server block uses)

BLOCK = re.compile(r"(?P<directives>(?:<!-- (?:docs-test|ci): [^>]+ -->\n)*)```bash\n(?P<code>.*?)```", re.S)
DIRECTIVE = re.compile(r"<!-- docs-test: (?P<kind>skip|given): (?P<value>[^>]+?) -->")
CI_BLOCK = re.compile(r"<!-- ci: (setup|test) -->")
TRAINS = re.compile(r"recipes (fit|validate|test|predict|sweep|export)\b|torchrun")
SHOWN_SERVER = "http://127.0.0.1:5000"


class Block:
    """One ```bash block of a page: its code, its line, what it is given and why it is skipped (if it is)."""

    def __init__(self, page: Path, text: str, match: re.Match) -> None:
        self.where = f"{page.relative_to(REPO)}:{text[: match.start('code')].count(chr(10))}"
        self.code = match.group("code")
        directives = {d.group("kind"): d.group("value") for d in DIRECTIVE.finditer(match.group("directives"))}
        self.skip = directives.get("skip")
        if CI_BLOCK.search(match.group("directives")):  # the README's two commands
            self.skip = "CI runs this block on a fresh machine (.ci/run)"
        self.givens = directives.get("given", "").split()


def pages() -> dict[str, list[Block]]:
    """Every page with a ```bash block, its blocks in order."""
    found = {}
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        text = page.read_text()
        blocks = [Block(page, text, match) for match in BLOCK.finditer(text)]
        if blocks:
            found[str(page.relative_to(REPO))] = blocks
    return found


PAGES = pages()


def trains(blocks: list[Block]) -> bool:
    return any(block.skip is None and (TRAINS.search(block.code) or block.givens) for block in blocks)


def run_in(workdir: Path, args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(args, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{args}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def spiral_run(workdir: Path, env: dict[str, str]) -> None:
    """A finished run of the spiral recipe in the directory's store (3 epochs)."""
    run_in(workdir, ["recipes", "fit", "-c", "configs/spiral_mlp.yaml", "--trainer.max_epochs", "3"], env)


def own_table(workdir: Path, env: dict[str, str]) -> None:
    """``my.csv`` (a churn table whose target is ``churned``), ``new_rows.csv`` (its rows without the target) and
    ``homes.parquet`` (a regression table whose target is ``price``)."""
    churn = pd.read_csv(REPO / "data" / "churn.csv").rename(columns={"churn": "churned"}).head(600)
    churn.to_csv(workdir / "my.csv", index=False)
    churn.drop(columns="churned").head(20).to_csv(workdir / "new_rows.csv", index=False)
    homes = pd.read_csv(REPO / "data" / "diabetes.csv").rename(columns={"progression": "price"})
    homes.to_parquet(workdir / "homes.parquet")


def events(workdir: Path, env: dict[str, str]) -> None:
    """``events/``: a folder of two Parquet files, 4 numeric columns and a 0/1 target ``clicked``."""
    rng = np.random.default_rng(0)
    (workdir / "events").mkdir()
    for part in range(2):
        x = rng.normal(size=(2000, 4)).astype("float32")
        frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(4)])
        frame["clicked"] = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64")
        frame.to_parquet(workdir / "events" / f"part-{part}.parquet")


GIVENS: dict[str, Callable[[Path, dict[str, str]], None]] = {
    "spiral-run": spiral_run,
    "own-table": own_table,
    "events": events,
    "tracking-server": lambda workdir, env: None,  # the server fixture; see test_a_page_s_commands_run
}


def newest_run_id(workdir: Path, env: dict[str, str]) -> str:
    """The newest FINISHED run of the directory's store (or the tracking server the page uses)."""
    from mlflow import MlflowClient

    uri = env.get("MLFLOW_TRACKING_URI", f"sqlite:///{workdir / 'mlflow.db'}")
    client = MlflowClient(tracking_uri=uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, "attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
                              max_results=1)
    assert runs, f"no finished run in {uri} for <run id>"
    return runs[0].info.run_id


def test_every_block_is_run_or_says_why_not():
    blocks = [block for page in PAGES.values() for block in page]
    assert len(blocks) >= 20
    for block in blocks:
        assert set(block.givens) <= set(GIVENS), f"{block.where}: unknown given {block.givens}"
        if block.skip is not None:
            assert len(block.skip.strip()) > 10, block.where
            for test in re.findall(r"tests/[\w/]+\.py", block.skip):
                assert (REPO / test).is_file(), f"{block.where}: {test}"
    run = [block for block in blocks if block.skip is None]
    assert len(run) >= 10, [block.where for block in run]


def page_params() -> list:
    return [pytest.param(name, marks=[pytest.mark.slow] if trains(blocks) else [], id=name)
            for name, blocks in PAGES.items()]


@pytest.mark.parametrize("page", page_params())
def test_a_page_s_commands_run(page: str, tmp_path: Path, request: pytest.FixtureRequest):
    blocks = PAGES[page]
    if all(block.skip is not None for block in blocks):
        pytest.skip("; ".join(f"{block.where}: {block.skip}" for block in blocks))
    workdir = tmp_path / "reader"
    workdir.mkdir()
    for name in ("configs", "data"):
        (workdir / name).symlink_to(REPO / name, target_is_directory=True)
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_TRACKING_URI"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = str(REPO)
    for block in blocks:
        if block.skip is not None:
            continue
        code = block.code
        if "tracking-server" in block.givens:
            uri = request.getfixturevalue("server").uri
            env["MLFLOW_TRACKING_URI"] = uri
            code = re.sub(r"(?m)^mlflow server .*(\n\s+--.*)*\n", "", code).replace(SHOWN_SERVER, uri)
        for given in block.givens:
            GIVENS[given](workdir, env)
        if "<run id>" in code:
            code = code.replace("<run id>", newest_run_id(workdir, env))
        done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{block.where}:\n{code}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        assert "Traceback" not in done.stderr, f"{block.where}:\n{done.stderr[-4000:]}"
    shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
