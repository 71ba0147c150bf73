"""`recipes compare`: three tiny spiral runs with different learning rates, compared in every output format."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest
from mlflow.entities import Metric

from recipes.compare import differing_params, lower_is_better, main, plot_curves, summarize_history
from tests.conftest import SPIRAL, mlflow_client, runs_of

LRS = ("0.01", "0.05", "0.1")


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """Three 2-epoch `recipes fit` runs of the spiral recipe, lr 0.01, 0.05 and 0.1, in one embedded store."""
    from recipes.cli import main as cli_main

    directory = tmp_path_factory.mktemp("compare")
    old = Path.cwd()
    saved_uri = os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.chdir(directory)
    try:
        for lr in LRS:
            cli_main(
                ["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "2", "--model.init_args.optimizer.init_args.lr", lr]
            )
    finally:
        os.chdir(old)
        if saved_uri is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved_uri
    return directory


@pytest.fixture
def in_store(three_runs, monkeypatch):
    """Work in the directory of the three runs, with the default tracking URI (./mlflow.db)."""
    monkeypatch.chdir(three_runs)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return three_runs


def _json(capsys, *args: str) -> list[dict]:
    assert main(["--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_table_lists_the_three_runs_and_only_differing_params(in_store, capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert "lr" in header
    assert "batch_size" not in header and "seed" not in header  # equal in all runs
    assert "val/acc" in header  # the spiral recipe monitors val/acc (from the run's config.yaml)
    for run in runs_of(in_store, "spiral_mlp"):
        assert run.info.run_id[:8] in out
    for lr in LRS:
        assert lr in out
    assert len(out.splitlines()) == 5  # header, rule, three runs


def test_best_and_last_match_the_metric_history(in_store, capsys):
    client = mlflow_client(in_store)
    for metric, best_of in (("val/acc", max), ("val/loss", min)):
        rows = _json(capsys, "--experiment", "spiral_mlp", "--metric", metric)
        assert len(rows) == 3
        for row in rows:
            history = sorted(client.get_metric_history(row["id"], metric), key=lambda m: m.step)
            best = best_of(history, key=lambda m: m.value)
            assert row[f"{metric} best"] == pytest.approx(best.value)
            assert row[f"{metric} last"] == pytest.approx(history[-1].value)
            assert row["best step"] == best.step
            assert row["best epoch"] in (0, 1)
            assert row["lr"] in LRS


def test_json_has_the_columns(in_store, capsys):
    rows = _json(capsys)
    assert {r["lr"] for r in rows} == set(LRS)
    expected = {"run", "id", "experiment", "status", "start", "duration (s)", "lr", "val/acc best", "val/acc last",
                "best step", "best epoch"}
    for row in rows:
        assert expected <= set(row)
        assert row["experiment"] == "spiral_mlp" and row["status"] == "FINISHED"
        assert row["start"].endswith("Z") and row["duration (s)"] >= 0
        assert "batch_size" not in row


def test_csv_parses_with_three_rows(in_store, capsys):
    assert main(["--format", "csv", "--metric", "val/loss"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 3
    assert {r["lr"] for r in rows} == set(LRS)
    assert all(float(r["val/loss best"]) <= float(r["val/loss last"]) + 1e-12 for r in rows)


def test_plot_writes_a_png_with_one_line_per_run(in_store, capsys):
    assert main(["--plot", "curves.png", "--metric", "val/loss"]) == 0
    data = (in_store / "curves.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1024
    client = mlflow_client(in_store)
    runs = runs_of(in_store, "spiral_mlp")
    histories = {r.info.run_id: client.get_metric_history(r.info.run_id, "val/loss") for r in runs}
    fig = plot_curves(runs, histories, "val/loss", in_store / "direct.png")
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(runs) == 3 and len(fig.axes[0].get_lines()) == 3  # one curve per run
    assert labels == [f"{r.info.run_name} ({r.info.run_id[:8]})" for r in runs]


def test_stage_filter(in_store, capsys):
    assert main(["--stage", "test"]) == 2
    assert "no runs" in capsys.readouterr().err
    assert len(_json(capsys, "--stage", "all")) == 3
    assert main(["--format", "json", "--max-runs", "1"]) == 0
    out = capsys.readouterr()
    assert len(json.loads(out.out)) == 1  # valid JSON on stdout; the note goes to stderr
    assert "showing the newest 1 of 3 matching runs; 2 left out (--max-runs 1)" in out.err


def test_unknown_experiment_and_metric_exit_2(in_store, capsys):
    assert main(["--experiment", "nope"]) == 2
    err = capsys.readouterr().err
    assert "experiment 'nope' not found" in err and "spiral_mlp" in err
    assert main(["--metric", "val/nothing"]) == 2
    assert "val/nothing" in capsys.readouterr().err


def test_tracking_uri_names_another_store(three_runs, workdir, capsys):
    assert main([]) == 2  # the fresh working directory has no mlflow.db, and none is created
    assert "no MLflow database" in capsys.readouterr().err
    assert not (workdir / "mlflow.db").exists()
    rows = _json(capsys, "--tracking-uri", f"sqlite:///{three_runs / 'mlflow.db'}")
    assert len(rows) == 3


def test_unreachable_server_exits_2(workdir, capsys):
    assert main(["--tracking-uri", "http://127.0.0.1:1"]) == 2
    assert "http://127.0.0.1:1" in capsys.readouterr().err


def test_helpers():
    assert lower_is_better("val/loss") and lower_is_better("val/rmse") and lower_is_better("val/ppl")
    assert not lower_is_better("val/acc") and not lower_is_better("val/f1")
    history = [Metric("val/acc", v, 0, s) for s, v in ((0, 0.5), (1, 0.9), (2, 0.9), (3, 0.8))]
    assert summarize_history(history, "val/acc") == {"best": 0.9, "last": 0.8, "best_step": 1}
    assert summarize_history(history, "val/error") == {"best": 0.5, "last": 0.8, "best_step": 0}
    assert summarize_history([], "val/acc")["best"] is None

    class _Run:
        def __init__(self, params):
            self.data = type("D", (), {"params": params})()

    runs = [_Run({"lr": "0.1", "bs": "64"}), _Run({"lr": "0.2", "bs": "64", "extra": "x"})]
    assert differing_params(runs) == ["extra", "lr"]


def test_recipes_compare_is_a_subcommand_of_recipes(in_store, capsys):
    from recipes.cli import main as recipes_main

    with pytest.raises(SystemExit) as exc:
        recipes_main(["compare", "--format", "json"])
    assert exc.value.code == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 and len({row["run"] for row in rows}) == 3  # run names are unique


def test_default_lists_every_experiment_and_experiment_narrows_it(workdir, capsys):
    """Without --experiment the runs of every experiment are compared; --experiment keeps one experiment's."""
    from mlflow.tracking import MlflowClient

    from recipes.compare import STAGE_TAG

    uri = f"sqlite:///{workdir / 'many.db'}"
    client = MlflowClient(tracking_uri=uri)
    for name, lr in (("first", "0.1"), ("second", "0.2")):
        run = client.create_run(client.create_experiment(name), tags={STAGE_TAG: "fit"})
        client.log_param(run.info.run_id, "lr", lr)
        for step, value in enumerate((0.5, 0.7)):
            client.log_metric(run.info.run_id, "val/acc", value, step=step)
        client.set_terminated(run.info.run_id)
    rows = _json(capsys, "--tracking-uri", uri, "--metric", "val/acc")
    assert sorted((r["experiment"], r["lr"]) for r in rows) == [("first", "0.1"), ("second", "0.2")]
    assert all(r["val/acc best"] == pytest.approx(0.7) for r in rows)
    rows = _json(capsys, "--tracking-uri", uri, "--metric", "val/acc", "--experiment", "second")
    assert [r["experiment"] for r in rows] == ["second"] and "lr" not in rows[0]  # one run: no param differs
