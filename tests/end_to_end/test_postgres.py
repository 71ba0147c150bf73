"""PostgreSQL as a team uses it, against a real server (``tests/postgres_server.py``): an ``mlflow server`` on
``--backend-store-uri postgresql://...`` and two ``recipes sweep`` workers tracking there, on one ``--storage
postgresql://...`` study; a fit tracked straight into ``MLFLOW_TRACKING_URI=postgresql://...``; and
one ``recipes: error:`` line (password masked, no traceback, nothing trained) from fit, sweep and compare for a
missing driver, a port where nothing listens and a wrong password."""

from __future__ import annotations

import subprocess
import sys

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import TrialState

from recipes.cli import main
from tests.conftest import SPIRAL, recipes_env
from tests.mlflow_server import MlflowServer
from tests.postgres_server import PASSWORD, PostgresServer, free_port
from tests.sweep_runs import SHORT, SWEEP
from tests.preloaded_python import preloaded_popen, preloaded_run

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tracking_db(postgres: PostgresServer) -> str:
    """A team's MLflow database on the server (``postgresql://``, no driver named), its tables made once, as the
    team's ``mlflow server`` or first run makes them."""
    url = postgres.create_database("mlflow_team")
    MlflowClient(url).search_experiments(max_results=1)
    return url


@pytest.mark.slow
def test_two_sweep_workers_one_postgresql_study_and_a_server_on_postgresql(postgres, workdir, tmp_path_factory):
    # the team's setup (README, "The whole team on PostgreSQL"): the server's store and the study in one PostgreSQL,
    # both written postgresql:// as PostgreSQL documents them
    server = MlflowServer(tmp_path_factory.mktemp("server"), postgres.create_database("mlflow_server"))
    storage = postgres.create_database("optuna_team")
    server.start()
    try:
        command = [sys.executable, "-m", "recipes", "sweep", "-c", str(SPIRAL), "-c", str(SWEEP), *SHORT,
                   "--trainer.max_epochs", "2", "--n_trials", "2", "--storage", storage]
        env = {**recipes_env(), "MLFLOW_TRACKING_URI": server.uri, "OMP_NUM_THREADS": "1"}
        workers = [preloaded_popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                   for _ in range(2)]
        outputs = [w.communicate(timeout=400)[0] for w in workers]
        check_sweep(MlflowClient(server.uri), storage, workers, outputs)
    finally:
        server.stop()


def check_sweep(client: MlflowClient, storage: str, workers: list[subprocess.Popen], outputs: list[str]) -> None:
    """One study of 2 complete trials, each a FINISHED run under one FINISHED parent, with the trial's value."""
    assert [w.returncode for w in workers] == [0, 0], "\n----\n".join(out[-3000:] for out in outputs)  # shown whole
    leaks = [line for out in outputs for line in out.splitlines() if PASSWORD in line]
    assert not leaks  # the storage is shown as postgresql://loopwise:***@...

    study = optuna.load_study(study_name="spiral_mlp-sweep", storage=storage)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2
    values = {t.number: t.value for t in study.trials}
    assert all(0.0 < v <= 1.0 for v in values.values())  # val/acc, best of each trial's validations

    experiment = client.get_experiment_by_name("spiral_mlp")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if r.data.tags.get("loopwise.stage") == "sweep"]
    trials = [r for r in runs if r.data.tags.get("loopwise.stage") == "fit"]
    assert parent.info.status == "FINISHED" and len(trials) == 2
    assert parent.data.params["sweep.storage"] == storage.replace(f":{PASSWORD}@", ":***@")
    for run in trials:
        assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        history = client.get_metric_history(run.info.run_id, "val/acc")
        number = int(run.data.tags["loopwise.sweep.trial"])
        assert len(history) == 2 and max(m.value for m in history) == pytest.approx(values[number])
        assert "config.yaml" in {f.path for f in client.list_artifacts(run.info.run_id)}  # the server's artifacts


def test_a_fit_tracks_straight_into_postgresql(tracking_db, workdir, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_db)  # postgresql://loopwise:<password>@127.0.0.1:<port>/...
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "2", "--data.init_args.n_samples", "600",
          "--trainer.logger.init_args.experiment_name", "pg_fit", "--mlflow_model", "false"])
    client = MlflowClient(tracking_db)
    [run] = client.search_runs([client.get_experiment_by_name("pg_fit").experiment_id])
    assert run.info.status == "FINISHED"
    assert [m.value > 0 for m in client.get_metric_history(run.info.run_id, "val/acc")] == [True, True]  # 2 epochs
    assert {"train/loss", "val/loss", "val/acc"} <= set(run.data.metrics)
    assert "config.yaml" in {f.path for f in client.list_artifacts(run.info.run_id)}


def failing_url(kind: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A URL that cannot be used and what its one line must say."""
    if kind == "no driver":  # as without loopwise[postgres]: no PostgreSQL driver can be imported
        for module in ("psycopg", "psycopg2", "pg8000"):
            monkeypatch.setitem(sys.modules, module, None)
        return f"postgresql://loopwise:{PASSWORD}@127.0.0.1:5432/team", "pip install 'loopwise[postgres]'"
    if kind == "nothing listens":
        return f"postgresql://loopwise:{PASSWORD}@127.0.0.1:{free_port()}/team", "does not answer (Connection refused)"
    server = request.getfixturevalue("postgres")
    return server.url("postgres", password="not-the-password"), "refused the login (password authentication failed"


@pytest.mark.parametrize("kind", ["no driver", "nothing listens", "wrong password"])
@pytest.mark.parametrize("command", ["fit", "sweep", "compare"])
def test_an_unusable_database_is_one_line_with_the_password_masked(command, kind, request, workdir, monkeypatch,
                                                                   capsys):
    url, says = failing_url(kind, request, monkeypatch)
    if command == "sweep":  # the study's storage (tracking in ./mlflow.db)
        args = ["sweep", "-c", str(SPIRAL), "-c", str(SWEEP), *SHORT, "--n_trials", "1", "--storage", url]
    else:  # the tracking store
        monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
        args = ["fit", "-c", str(SPIRAL), *SHORT] if command == "fit" else ["compare"]
    with pytest.raises(SystemExit) as stop:
        main(args)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert stop.value.code == 2 and len(lines) == 1, err
    prefix = {"fit": "recipes: error: the tracking store ", "sweep": "recipes sweep: error: the sweep storage ",
              "compare": "recipes compare: error: the tracking store "}[command]
    masked = url.replace(":not-the-password@", ":***@").replace(f":{PASSWORD}@", ":***@")
    assert lines[0].startswith(prefix) and masked in lines[0] and says in lines[0], lines[0]
    assert "***" in lines[0] and PASSWORD not in out + err and "not-the-password" not in out + err
    assert not (workdir / "checkpoints").exists() and not (workdir / "optuna.db").exists()  # nothing trained


@pytest.mark.slow
def test_the_sweep_process_ends_with_one_line_for_a_database_that_does_not_answer(workdir):
    url = f"postgresql://loopwise:{PASSWORD}@127.0.0.1:{free_port()}/optuna"
    out = preloaded_run([sys.executable, "-m", "recipes", "sweep", "-c", str(SPIRAL), "-c", str(SWEEP), *SHORT,
                         "--storage", url], cwd=workdir, env=recipes_env(), timeout=120)
    assert out.returncode == 2
    assert [line for line in out.stderr.splitlines() if line.strip()] == [
        f"recipes sweep: error: the sweep storage (--storage) {url.replace(PASSWORD, '***')} does not answer "
        "(Connection refused): start the database server, or fix the host and port in the URL"
    ]


TEAM_PASSWORD = "Zq9/x#y?w@Secret"  # as pasted from a password manager
SLASHED_PASSWORD = "Zq9/Secret/x"  # a raw '/' is read by SQLAlchemy; '@', '#', '?' must be percent-encoded


@pytest.mark.parametrize("written", ["percent-encoded", "raw slash"])
def test_a_password_with_special_characters_is_in_no_output_and_no_record(written, postgres, workdir, monkeypatch,
                                                                          capsys):
    import psycopg
    from urllib.parse import quote

    password = TEAM_PASSWORD if written == "percent-encoded" else SLASHED_PASSWORD
    role = f"team_{written.replace(' ', '_').replace('-', '_')}"
    with psycopg.connect(postgres.dsn("postgres"), autocommit=True) as connection:
        connection.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        connection.execute(f'CREATE DATABASE "{role}" OWNER {role}')
    in_url = quote(password, safe="") if written == "percent-encoded" else password
    url = f"postgresql://{role}:{in_url}@127.0.0.1:{postgres.port}/{role}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "1", "--data.init_args.n_samples", "300",
          "--trainer.logger.init_args.experiment_name", "secret_fit", "--mlflow_model", "false"])
    for args in (["compare", "--experiment", "secret_fit"], ["sync"]):
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert stop.value.code == 0
    out, err = capsys.readouterr()
    fragments = {password, quote(password, safe=""), "Secret"}
    client = MlflowClient(url)
    [run] = client.search_runs([client.get_experiment_by_name("secret_fit").experiment_id])
    assert run.info.status == "FINISHED" and "val/loss" in run.data.metrics  # the URL works as written
    recorded = [*run.data.params.values(), *run.data.tags.values()]
    for artifact in client.list_artifacts(run.info.run_id):
        if artifact.path.endswith((".yaml", ".json", ".txt")):
            recorded.append(open(client.download_artifacts(run.info.run_id, artifact.path)).read())
    recorded += [path.read_text(errors="replace") for path in (workdir / "checkpoints").rglob("*.jsonl")]
    assert any("Zq9" not in text for text in recorded) and len(recorded) > 20
    leaks = [(fragment, text[:200]) for fragment in fragments for text in [out, err, *recorded] if fragment in text]
    assert not leaks
