"""A tracking server that refuses to create the run (issue 53, section 5): `recipes fit` against a server that answers
HTTP 503 to `runs/create` prints one `recipes: error:` line naming the server (its password masked) and the answer,
not MLflow's 109-line traceback, trains nothing and exits non-zero.

The server is a stub of MLflow's REST API (``http.server`` in a thread on 127.0.0.1): it answers the calls a fit makes
before it creates the run (the experiment search of the start-up check, the experiment's lookup and creation) as an
MLflow server does, and 503 to every `runs/create`, as a server behind a proxy whose backend is down does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from recipes.cli import main
from tests.conftest import SPIRAL

PASSWORD = "s3cret-Pw"
EXPERIMENT = {"experiment_id": "1", "name": "spiral_mlp", "lifecycle_stage": "active",
              "artifact_location": "mlflow-artifacts:/1", "tags": []}


class RefusesRunCreation(BaseHTTPRequestHandler):
    """MLflow's REST API, as far as a fit goes before its run exists; 503 for `runs/create`."""

    requests: list[str] = []

    def answer(self, status: int, body: dict | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_one(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        path = self.path.split("?", 1)[0]
        self.requests.append(f"{self.command} {path}")
        if path.endswith("/runs/create"):
            self.answer(503, "<html><body><h1>503 Service Unavailable</h1>No server is available.</body></html>")
        elif path.endswith("/experiments/get-by-name"):
            self.answer(404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "Could not find experiment"})
        elif path.endswith("/experiments/create"):
            self.answer(200, {"experiment_id": "1"})
        elif path.endswith("/experiments/get"):
            self.answer(200, {"experiment": EXPERIMENT})
        elif path.endswith("/experiments/search"):
            self.answer(200, {"experiments": [EXPERIMENT]})
        elif path.endswith("/runs/search"):
            self.answer(200, {"runs": []})
        else:
            self.answer(200, {})

    do_GET = do_POST = do_PATCH = do_DELETE = handle_one

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def refusing_server() -> Iterator[str]:
    """The stub on a free port of 127.0.0.1; yields its host:port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), RefusesRunCreation)
    RefusesRunCreation.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_503_to_runs_create_is_one_error_line_with_the_password_masked(workdir, refusing_server, monkeypatch,
                                                                           capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://loopwise:{PASSWORD}@{refusing_server}")
    with pytest.raises(SystemExit) as done:
        main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--mlflow_model", "false"])
    assert done.value.code != 0
    captured = capsys.readouterr()
    err, out = captured.err, captured.out
    assert "POST /api/2.0/mlflow/runs/create" in RefusesRunCreation.requests
    (line,) = [x for x in err.splitlines() if x.startswith("recipes: error:")]
    assert line.startswith(f"recipes: error: the tracking server at http://loopwise:***@{refusing_server} refused "
                           "to create the run (HTTP 503")
    assert "Traceback" not in err and len(err.splitlines()) <= 3, err
    assert PASSWORD not in err + out
    assert not (workdir / "checkpoints").exists()  # nothing was trained
