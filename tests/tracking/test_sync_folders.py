"""`recipes sync` tolerates what people do to the folders it reads (issue 53, section 2 and the sync line of section
5): a damaged journal line is one warning and the rest is replayed, a run folder copied aside is reported and never
becomes a second run, quotes in folder names need no escaping from the user, two first commands on a new store take
turns, and the command's result is one summary line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.cli import main
from recipes.tracking.journal import JOURNAL_NAME
from tests.conftest import SPIRAL, mlflow_client, recipes_env, runs_of
from tests.preloaded_python import preloaded_popen, preloaded_run
from tests.resume_runs import TINY

OTHER_ID = "0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def fitted(clean_workdir) -> Path:
    """The run folder of one finished 2-epoch spiral fit (its store is ``<folder>/../../../mlflow.db``)."""
    with clean_workdir("sync_folders") as directory:
        main(["fit", "-c", str(SPIRAL), *TINY, "--trainer.max_epochs", "2", "--mlflow_model", "false"])
    (journal,) = (directory / "checkpoints" / "spiral_mlp").glob(f"*/{JOURNAL_NAME}")
    return journal.parent


def copy_run(fitted: Path, workdir: Path, experiment: str = "spiral_mlp", name: str | None = None) -> Path:
    """The fitted run's folder copied to ``workdir/checkpoints/<experiment>/<name or its id>``."""
    target = workdir / "checkpoints" / experiment / (name or fitted.name)
    shutil.copytree(fitted, target)
    return target


def with_the_run_in_its_store(fitted: Path, workdir: Path) -> None:
    """``workdir/mlflow.db`` as the fit's store (which holds the run)."""
    shutil.copyfile(fitted.parents[2] / "mlflow.db", workdir / "mlflow.db")


def sync(workdir: Path, *args: str) -> tuple[int, str, str]:
    """`recipes sync ...` in a process of its own (what a user sees on the terminal): exit code, stdout, stderr."""
    done = preloaded_run([sys.executable, "-m", "recipes", "sync", *args], cwd=workdir, env=recipes_env(), timeout=300)
    return done.returncode, done.stdout, done.stderr


def history(directory: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow_client(directory).get_metric_history(run_id, key))


def test_damaged_journal_lines_are_skipped_with_one_warning_each_and_the_rest_is_replayed(fitted, workdir):
    folder = copy_run(fitted, workdir)  # a new store: the run is recreated from its journal alone
    journal = folder / JOURNAL_NAME
    lines = journal.read_bytes().splitlines(keepends=True)
    damaged = [b"\xff\xfe\x00 not text\n", b"[1, 2]\n", b'"text"\n', b'{"kind": "metrics", "step": 1, "values": [1]}\n']
    journal.write_bytes(b"".join(lines[:2] + damaged + lines[2:]))
    code, out, err = sync(workdir)
    assert code == 0 and "Traceback" not in err, err
    warned = [line for line in err.splitlines() if "of the run journal" in line]
    assert len(warned) == 4, err
    for number, line in zip((3, 4, 5, 6), warned):
        shown = journal.relative_to(workdir)  # as the command names it: under --checkpoints_dir
        assert line.startswith(f"recipes: warning: line {number} of the run journal {shown} is not a journal entry")
    (run,) = runs_of(workdir, "spiral_mlp")
    assert run.data.tags["loopwise.replayed_from_run"] == fitted.name and run.info.status == "FINISHED"
    for key in ("val/acc", "train/loss"):  # everything the undamaged lines hold
        assert history(workdir, run.info.run_id, key) == history(fitted.parents[2], fitted.name, key)


@pytest.mark.parametrize("store_holds_the_run", [True, False], ids=["store_holds_the_run", "new_store"])
def test_a_run_folder_copied_aside_is_reported_and_not_replayed_as_a_second_run(fitted, workdir,
                                                                                store_holds_the_run):
    if store_holds_the_run:
        with_the_run_in_its_store(fitted, workdir)
    copy_run(fitted, workdir)
    copy_run(fitted, workdir, name=f"{fitted.name}.bak")  # backed up before an experiment
    code, out, err = sync(workdir)
    assert code == 0, err
    (run,) = runs_of(workdir, "spiral_mlp")  # one run, no phantom FINISHED copy
    assert (run.info.run_id == fitted.name) is store_holds_the_run
    (reported,) = [line for line in err.splitlines() if ".bak" in line]
    assert reported.startswith(f"recipes: warning: {Path('checkpoints') / 'spiral_mlp' / fitted.name}.bak holds "
                               f"a copy of run {fitted.name}'s journal") and "not replayed twice" in reported
    assert "1 skipped" in out


def test_quotes_in_experiment_and_run_folder_names_are_no_filter_error(fitted, workdir):
    copy_run(fitted, workdir, experiment="team's spiral")
    copy_run(fitted, workdir, experiment="team's spiral", name=f"{fitted.name}'s copy")
    copy_run(fitted, workdir, experiment="team's spiral", name=OTHER_ID)
    retag(workdir / "checkpoints" / "team's spiral" / OTHER_ID, fitted.name, OTHER_ID)
    for _ in range(2):  # recreated, then found recreated by its tag (a search filter holding the folder's name)
        code, out, err = sync(workdir)
        assert code == 0 and "Traceback" not in err, err
    runs = runs_of(workdir, "team's spiral")
    assert sorted(r.data.tags["loopwise.replayed_from_run"] for r in runs) == sorted([fitted.name, OTHER_ID])
    assert "0 replayed, 2 already complete, 1 skipped" in out


def retag(folder: Path, old_id: str, new_id: str) -> None:
    """The journal in ``folder`` as another run's (its run id replaced)."""
    journal = folder / JOURNAL_NAME
    journal.write_text(journal.read_text().replace(old_id, new_id))


def test_sync_prints_one_summary_line_and_the_detail_only_with_verbose(fitted, workdir):
    copy_run(fitted, workdir)
    retag(copy_run(fitted, workdir, name=OTHER_ID), fitted.name, OTHER_ID)
    code, out, err = sync(workdir)
    assert code == 0, err
    (line,) = out.strip().splitlines()
    folder = Path("checkpoints")
    assert line.startswith(f"recipes sync: 2 journal(s) under {folder}: 2 replayed (2 recreated), 0 already complete, "
                           "0 skipped; wrote "), line
    code, out, err = sync(workdir, "--verbose")
    lines = out.strip().splitlines()
    assert len(lines) == 3 and lines[-1].startswith(f"recipes sync: 2 journal(s) under {folder}: 0 replayed, 2 already "
                                                    "complete, 0 skipped; wrote 0 metric value(s), 0 param(s), 0 tag(s)")
    assert all("nothing written" in detail for detail in lines[:2]), lines


@pytest.mark.fresh_store
def test_two_syncs_at_once_on_a_new_store_take_turns(fitted, workdir):
    """No mlflow.db yet: both would create and migrate it (alembic), and both recreate the run."""
    copy_run(fitted, workdir)
    for attempt in range(3):
        (workdir / "mlflow.db").unlink(missing_ok=True)
        syncs = [preloaded_popen([sys.executable, "-m", "recipes", "sync"], cwd=workdir, env=recipes_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
        results = [(p.communicate(timeout=300), p.returncode) for p in syncs]
        for (out, err), code in results:
            assert code == 0 and "Traceback" not in err, f"attempt {attempt}: {out}{err[-3000:]}"
        assert len(runs_of(workdir, "spiral_mlp")) == 1  # recreated once: the second sync found it complete


def test_a_folder_named_no_run_id_whose_journal_names_no_run_is_reported_not_recreated(fitted, workdir):
    """A journal written before its start entries named the run: only its folder's name could say which run it is."""
    folder = copy_run(fitted, workdir, name="it's mine")
    journal = folder / JOURNAL_NAME
    journal.write_text(journal.read_text().replace(f', "run_id": "{fitted.name}"', ""))
    code, out, err = sync(workdir)
    assert code == 0 and "Traceback" not in err, err
    assert runs_of(workdir, "spiral_mlp") == []
    (reported,) = [line for line in err.splitlines() if "it's mine" in line]
    assert reported == (f"recipes: warning: {Path('checkpoints') / 'spiral_mlp' / folder.name} is not named after a "
                        "run id and its journal names no run: not replayed; name the folder after its run's id to "
                        "replay it")
    assert "0 replayed, 0 already complete, 1 skipped" in out
