"""Issue 57: `recipes.cli.main([...])` called from Python (a notebook, a script, a test) with the command as a list
says nothing about the calling program's own `sys.argv`: LightningCLI's "args parameter is intended to run from
within Python" warning was printed on every such call."""

from __future__ import annotations

import sys
import warnings

from recipes.cli import main
from tests.conftest import SPIRAL


def test_main_with_a_list_in_a_program_with_its_own_argv_warns_nothing_about_it(workdir, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["my_script.py", "--my-own-flag", "3"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["fit", "-c", str(SPIRAL), "--trainer.fast_dev_run", "1"])
    assert not [w for w in caught if "args parameter is intended" in str(w.message)]
