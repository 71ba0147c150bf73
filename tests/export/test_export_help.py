"""``recipes export --help`` says what the command is before the option list it shares with ``recipes predict``."""

from __future__ import annotations

import pytest

from recipes.cli import main


def test_export_help_names_the_command_before_predicts_options(capsys):
    with pytest.raises(SystemExit) as done:
        main(["export", "--help"])
    assert done.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("recipes export -c <recipe> --ckpt_path ")
    assert "save_pretrained" in out and "--export_dir" in out
