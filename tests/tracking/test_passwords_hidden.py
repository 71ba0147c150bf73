"""No password of a tracking store, a tracking server or a sweep storage reaches a command's output, whatever it holds
(``/``, ``#``, ``?``, ``@``), raw or percent-encoded, PostgreSQL, MySQL or an HTTP server, given as
``MLFLOW_TRACKING_URI``, ``--trainer.logger.init_args.tracking_uri`` or ``--storage``: a URL whose credentials
can be read is named with ``***`` for its password; one whose credentials cannot be read unambiguously is refused in
one line that names none of them and says to percent-encode the password. (The record of a run on a real
PostgreSQL server with such a password: ``tests/end_to_end/test_postgres.py``.)"""

from __future__ import annotations

from urllib.parse import quote

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL
from tests.postgres_server import free_port
from tests.sweep_runs import SHORT, SWEEP

PASSWORD = "Zq9/x#y?w@Secret"  # as pasted from a password manager
SLASHED = "Zq9/Secret/x"  # a raw '/' only: SQLAlchemy reads it, urllib does not
FRAGMENTS = ("Zq9", "Secret", quote(PASSWORD, safe=""), PASSWORD, SLASHED, quote(SLASHED, safe=""))


def url(kind: str) -> str:
    """A URL of ``kind`` on a port where nothing listens."""
    port = free_port()
    encoded = quote(PASSWORD, safe="")
    return {
        "postgresql encoded": f"postgresql://team:{encoded}@127.0.0.1:{port}/mlflow",
        "postgresql raw": f"postgresql://team:{PASSWORD}@127.0.0.1:{port}/mlflow",
        "postgresql raw slash": f"postgresql://team:{SLASHED}@127.0.0.1:{port}/mlflow",
        "postgresql bad port": f"postgresql://team:{encoded}@127.0.0.1:no{port}/mlflow",
        "mysql encoded": f"mysql://team:{encoded}@127.0.0.1:{port}/mlflow",
        "mysql raw": f"mysql://team:{PASSWORD}@127.0.0.1:{port}/mlflow",
        "http encoded": f"http://team:{encoded}@127.0.0.1:{port}",
        "http raw": f"http://team:{PASSWORD}@127.0.0.1:{port}",
        "http raw slash": f"http://team:{SLASHED}@127.0.0.1:{port}",
    }[kind]


REFUSED = {"postgresql raw", "mysql raw", "http raw", "http raw slash"}
KINDS = ["postgresql encoded", "postgresql raw", "postgresql raw slash", "postgresql bad port", "mysql encoded",
         "mysql raw", "http encoded", "http raw", "http raw slash"]


def command_args(command: str, address: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The command line of ``command`` using ``address`` as its store (or storage)."""
    if command == "fit --tracking_uri":
        return ["fit", "-c", str(SPIRAL), *SHORT, f"--trainer.logger.init_args.tracking_uri={address}"]
    if command == "sweep --storage":
        return ["sweep", "-c", str(SPIRAL), "-c", str(SWEEP), *SHORT, "--n_trials", "1", "--storage", address]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", address)
    return {"fit": ["fit", "-c", str(SPIRAL), *SHORT], "compare": ["compare"], "sync": ["sync"],
            "validate": ["validate", "-c", str(SPIRAL), *SHORT, "--ckpt_path", "best"]}[command]


COMMANDS = ["fit", "fit --tracking_uri", "validate", "compare", "sync", "sweep --storage"]
#: every command with every URL form (a sweep storage is a database URL: no server URL for it)
CASES = [(c, k) for c in COMMANDS for k in KINDS if not (c == "sweep --storage" and k.startswith("http"))]


@pytest.mark.parametrize(("command", "kind"), CASES)
def test_no_command_prints_a_password(command, kind, workdir, monkeypatch, capsys):
    (workdir / "checkpoints").mkdir()  # sync needs its folder to get as far as the store
    address = url(kind)
    with pytest.raises(SystemExit) as stop:
        main(command_args(command, address, monkeypatch))
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    leaked = [f for f in FRAGMENTS if f in out + err]
    assert not leaked, f"{leaked} in {out + err}"
    assert stop.value.code != 0 and len(lines) == 1, err
    assert lines[0].startswith("recipes"), lines[0]
    if kind in REFUSED:
        assert "cannot be read unambiguously" in lines[0] and "percent-encode the password" in lines[0], lines[0]
    else:
        assert "team:***@127.0.0.1" in lines[0], lines[0]
    assert not any((workdir / "checkpoints").iterdir()) and not (workdir / "optuna.db").exists()  # nothing trained
