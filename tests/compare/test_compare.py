"""`recipes compare` for people: a table per experiment, labels that say what differs, the data column, --sort,
--filter, the stage column, best epoch counted from 1, and tables that fit the terminal.

Most tests build MLflow runs directly in a temporary SQLite store (exact values, fast); one real 3-epoch `recipes
fit` of the spiral recipe checks what only a real run has (its config.yaml, its dataset inputs, its epoch lines).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from pathlib import Path

import pytest
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param
from mlflow.tracking import MlflowClient

from recipes.compare.command import main
from recipes.compare.runs import FIT_RUN_TAG, STAGE_TAG
from tests.conftest import SPIRAL, free_port, mlflow_client, runs_of

T0 = 1_700_000_000_000  # ms
LR = "model.init_args.optimizer.init_args.lr"


# --- a store of runs made directly -----------------------------------------------------------------------------
class Store:
    """An MLflow SQLite store in a temporary directory, and a way to add runs with exact values."""

    def __init__(self, directory: Path) -> None:
        self.uri = f"sqlite:///{directory / 'runs.db'}"
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiments: dict[str, str] = {}
        self.count = 0

    def experiment(self, name: str) -> str:
        if name not in self.experiments:
            self.experiments[name] = self.client.create_experiment(name)
        return self.experiments[name]

    def run(self, experiment: str, params: dict | None = None, metrics: dict | None = None, stage: str = "fit",
            data: dict | None = None, tags: dict | None = None, config: str | None = None) -> str:
        """A finished run, started a minute after the previous one; ``metrics``: name -> [(step, value), ...]."""
        self.count += 1
        start = T0 + self.count * 60_000
        run = self.client.create_run(self.experiment(experiment), start_time=start,
                                     tags={STAGE_TAG: stage, **(tags or {})}, run_name=f"{experiment}-{self.count}")
        run_id = run.info.run_id
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, start + s, s) for k, points in (metrics or {}).items() for s, v in points],
            params=[Param(k, str(v)) for k, v in (params or {}).items()],
        )
        if data:
            self.client.log_inputs(run_id, [DatasetInput(Dataset(f"Toy/{split}", digest, "code", "{}"),
                                                         [InputTag("mlflow.data.context", split)])
                                            for split, digest in data.items()])
        if config:
            self.client.log_text(run_id, config, "config.yaml")
        self.client.set_terminated(run_id, "FINISHED", end_time=start + 65_000)
        return run_id

    def compare(self, capsys, *args: str) -> tuple[int, str, str]:
        code = main(["--tracking-uri", self.uri, *args])
        out = capsys.readouterr()
        return code, out.out, out.err

    def rows(self, capsys, *args: str) -> list[dict]:
        code, out, err = self.compare(capsys, "--format", "json", *args)
        assert code == 0, err
        return json.loads(out)


@pytest.fixture
def store(workdir) -> Store:
    return Store(workdir)


def curve(values: list[float], steps_per_epoch: int = 10) -> list[tuple[int, float]]:
    """A validation value at the end of each epoch: steps 9, 19, 29, ..."""
    return [((i + 1) * steps_per_epoch - 1, v) for i, v in enumerate(values)]


def epochs(n: int, steps_per_epoch: int = 10) -> list[tuple[int, float]]:
    """Lightning's ``epoch`` metric (from 0) at the same steps."""
    return [((i + 1) * steps_per_epoch - 1, float(i)) for i in range(n)]


ACC_CONFIG = "model:\n  class_path: lightning_modules.ClassificationModule\n  init_args:\n    monitor: val/acc\n"
RMSE_CONFIG = "model:\n  class_path: lightning_modules.RegressionModule\n  init_args:\n    monitor: val/rmse\n"


def table_lines(out: str) -> list[str]:
    """The rows of the first table of a text output (after the rule line), with continuation lines."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("----"))
    return [line for line in lines[rule + 1:] if line and not line.startswith("(")]


# --- one table per experiment, each with its own metric ---------------------------------------------------------
def test_every_experiment_gets_its_own_table_and_monitored_metric(store, capsys):
    store.run("spiral", {"lr": 0.1}, {"val/acc": curve([0.5, 0.9, 0.8]), "val/loss": curve([1.0, 0.4, 0.5]),
                                      "epoch": epochs(3)}, config=ACC_CONFIG)
    store.run("spiral", {"lr": 0.01}, {"val/acc": curve([0.6, 0.7, 0.75]), "val/loss": curve([0.9, 0.8, 0.7]),
                                       "epoch": epochs(3)}, config=ACC_CONFIG)
    store.run("houses", {"lr": 0.1}, {"val/rmse": curve([3.0, 2.0, 2.5]), "val/loss": curve([9.0, 4.0, 6.2]),
                                      "epoch": epochs(3)}, config=RMSE_CONFIG)
    rows = store.rows(capsys)
    by_experiment = {(r["experiment"], r["metric"], r["best"], r["last"]) for r in rows}
    assert by_experiment == {("spiral", "val/acc", 0.9, 0.8), ("spiral", "val/acc", 0.75, 0.75),
                             ("houses", "val/rmse", 2.0, 2.5)}  # max for accuracy, min for rmse: none blank
    code, out, _ = store.compare(capsys)
    assert code == 0
    assert "spiral: 2 fit runs, val/acc (higher is better)" in out
    assert "houses: 1 fit run, val/rmse (lower is better)" in out
    spiral, houses = out.split("\n\n")  # two tables, a blank line between them
    assert re.search(r"lr=0\.1 .*0\.9 +0\.8 +2$", spiral, re.M)  # best 0.9 at epoch 2 (of 1, 2, 3), last 0.8
    assert re.search(r"lr=0\.01 .*0\.75 +0\.75 +3$", spiral, re.M)
    assert re.search(r"houses-3 .*2 +2\.5 +2$", houses, re.M)  # one run: its name is its label
    assert "(one run: no params to compare)" in houses
    # --metric applies to every table; an experiment that never logged it is left out, with a note
    code, out, err = store.compare(capsys, "--metric", "val/acc")
    assert code == 0 and "houses" not in out and "compare: experiment houses: metric 'val/acc'" in err
    code, out, err = store.compare(capsys, "--experiment", "houses", "--metric", "val/acc")
    assert code == 2 and err.startswith("recipes compare: error: experiment houses: metric 'val/acc' was not logged")


def test_best_epoch_counts_from_1_like_the_epoch_lines(store, capsys):
    store.run("e", {}, {"val/loss": curve([0.9, 0.5, 0.3, 0.4]), "epoch": epochs(4)})
    [row] = store.rows(capsys)
    assert row["best"] == 0.3 and row["best step"] == 29 and row["best epoch"] == 3  # logged epoch 2, the 3rd
    assert row["last"] == 0.4


# --- labels, wrapped tables ---------------------------------------------------------------------------------------
def test_labels_say_what_differs_and_csv_keeps_full_names(store, capsys):
    common = {"seed": 0, "data": "Toy", "model.init_args.model.init_args.hidden": 64}
    for lr, batch in (("0.003", 64), ("0.01", 64), ("0.01", 32)):
        derived = {"effective_batch_size": batch, "plan.batch_size": batch, "plan.batches_per_epoch": 2048 // batch}
        store.run("e", {**common, LR: lr, "batch_size": batch, **derived}, {"val/loss": curve([0.5])})
    rows = store.rows(capsys)
    assert [r["run"] for r in rows] == ["batch_size=32 lr=0.01", "batch_size=64 lr=0.01", "batch_size=64 lr=0.003"]
    first = rows[0]
    assert first[f"params.{LR}"] == "0.01" and first["params.plan.batches_per_epoch"] == "64"
    assert first["params.effective_batch_size"] == "32"
    assert "params.seed" not in first and "params.data" not in first  # equal in every run
    assert len(first["id"]) == 32
    code, out, _ = store.compare(capsys, "--format", "csv")
    parsed = list(csv.DictReader(io.StringIO(out)))
    assert [r[f"params.{LR}"] for r in parsed] == ["0.01", "0.01", "0.003"] and len(parsed[0]["id"]) == 32
    code, out, _ = store.compare(capsys)
    assert "(+3 differing params that follow from the ones named" in out  # effective_batch_size, plan.*
    assert table_lines(out)[0].startswith("batch_size=32 lr=0.01  ")


def test_runs_with_equal_params_are_told_apart_by_their_data_or_id(store, capsys):
    store.run("e", {"lr": 0.1}, {"val/loss": curve([0.5])}, data={"train": "a" * 32})
    store.run("e", {"lr": 0.1}, {"val/loss": curve([0.4])}, data={"train": "b" * 32})
    store.run("e", {"lr": 0.2}, {"val/loss": curve([0.3])}, data={"train": "b" * 32})
    rows = store.rows(capsys)
    digests = {r["data inputs"].split(":")[1][0]: r["data digest"] for r in rows}
    assert [r["run"] for r in rows] == ["lr=0.2", f"lr=0.1 data={digests['b']}", f"lr=0.1 data={digests['a']}"]
    store.run("e", {"lr": 0.2}, {"val/loss": curve([0.3])}, data={"train": "b" * 32})
    rows = store.rows(capsys)
    assert rows[0]["run"] == f"lr=0.2 {rows[0]['id'][:8]}" and rows[1]["run"] == f"lr=0.2 {rows[1]['id'][:8]}"


@pytest.mark.parametrize("columns", [80, 60])
def test_every_line_fits_the_terminal(store, capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    for i in range(4):
        params = {LR: f"0.00{i + 1}", "model.init_args.model.init_args.hidden_sizes": f"[{64 * (i + 1)}, 128, 128]",
                  "schedule.warmup_fraction": 0.05 * i, "plan.warmup_steps": i, "optimizer": ["AdamW", "SGD"][i % 2],
                  "a_rather_long_parameter_name_for_a_setting": "x" * (10 + i)}
        store.run("a_long_experiment_name", params, {"val/loss": curve([0.5 - i / 10, 0.4]), "epoch": epochs(2)},
                  data={"train": "abc" * 11, "val": "def" * 11 if i else "123" * 11})
    labels = [r["run"] for r in store.rows(capsys)]
    assert labels[0] == ("a_rather_long_parameter_name_for_a_setting=xxxxxxxxxxxxx hidden_sizes=[256,128,128] "
                         "lr=0.004 optimizer=SGD warmup_fraction=0.15")  # short names and numbers, no spaces
    assert not any("plan.warmup_steps" in label for label in labels)  # the plan's arithmetic is not in the label
    code, out, _ = store.compare(capsys)
    assert code == 0 and max(len(line) for line in out.splitlines()) <= columns
    assert "differs:" in out and "same" in out
    words = " ".join(line.split("  ")[0].strip() for line in table_lines(out))
    assert "hidden_sizes=" in words and "lr=0.004" in words  # the labels wrap within their column
    code, out, _ = store.compare(capsys, "--format", "csv")
    assert f"params.{LR}" in out.splitlines()[0]  # csv: full names


# --- data column --------------------------------------------------------------------------------------------------
def test_data_column_marks_the_runs_whose_data_differs(store, capsys):
    same = {"train": "1" * 32, "val": "2" * 32}
    store.run("e", {"lr": 0.1}, {"val/loss": curve([0.5])}, data=same)
    store.run("e", {"lr": 0.2}, {"val/loss": curve([0.5])}, data={"train": "1" * 32, "val": "9" * 32})
    store.run("e", {"lr": 0.3}, {"val/loss": curve([0.5])}, data=same)
    store.run("e", {"lr": 0.4}, {"val/loss": curve([0.5])})  # recorded no data
    rows = {r["run"]: r for r in store.rows(capsys)}
    assert {k: r["data"] for k, r in rows.items()} == {"lr=0.1": "same", "lr=0.2": "differs: val", "lr=0.3": "same",
                                                       "lr=0.4": "-"}
    assert rows["lr=0.1"]["data digest"] == rows["lr=0.3"]["data digest"] != rows["lr=0.2"]["data digest"]
    assert rows["lr=0.1"]["data inputs"] == f"Toy/train:{'1' * 32}; Toy/val:{'2' * 32}"
    code, out, _ = store.compare(capsys)
    assert "data Toy: train 11111111 val 22222222" in out  # what "same" means: the digests most runs have
    assert re.search(r"^lr=0\.2 .* differs: val", out, re.M)


def test_two_runs_with_different_data_both_differ(store, capsys):
    store.run("e", {"lr": 0.1}, {"val/loss": curve([0.5])}, data={"train": "1" * 32})
    store.run("e", {"lr": 0.2}, {"val/loss": curve([0.5])}, data={"train": "2" * 32})
    assert [r["data"] for r in store.rows(capsys)] == ["differs: train", "differs: train"]  # no majority


def test_no_data_recorded_means_no_data_column(store, capsys):
    store.run("e", {"lr": 0.1}, {"val/loss": curve([0.5])})
    store.run("e", {"lr": 0.2}, {"val/loss": curve([0.5])})
    code, out, _ = store.compare(capsys)
    assert "data not recorded" in out.splitlines()[0] and " data " not in out.splitlines()[2]


# --- --stage all ----------------------------------------------------------------------------------------------------
def test_stage_all_puts_test_scores_beside_the_params(store, capsys):
    fit = store.run("e", {"lr": 0.1}, {"val/acc": curve([0.7, 0.8]), "epoch": epochs(2)}, data={"train": "1" * 32})
    store.run("e", {"lr": 0.2}, {"val/acc": curve([0.6, 0.9]), "epoch": epochs(2)}, data={"train": "1" * 32})
    store.run("e", {"lr": 0.1}, {"test/acc": [(0, 0.77)], "epoch": [(0, 0.0)]}, stage="test",
              data={"test": "3" * 32}, tags={FIT_RUN_TAG: fit})
    rows = store.rows(capsys, "--stage", "all", "--metric", "val/acc")
    test = next(r for r in rows if r["stage"] == "test")
    assert test["run"] == "lr=0.1" and test["metric"] == "test/acc" and test["best"] == 0.77
    assert test["best epoch"] is None and test["fit run id"] == fit and test["data"] == "same"
    assert {r["stage"] for r in rows} == {"fit", "test"}
    code, out, _ = store.compare(capsys, "--stage", "all", "--metric", "val/acc")
    assert out.splitlines()[0].startswith("e: 3 runs (test 1, fit 2), val/acc (higher is better; test/acc for")
    header = next(line for line in out.splitlines() if line.startswith("run "))
    assert header.split()[:3] == ["run", "id", "stage"]
    assert re.search(r"^lr=0\.1 +\w{8} +test .* 0\.77 +0\.77$", out, re.M)
    code, out, _ = store.compare(capsys, "--metric", "val/acc")  # fit runs only: no stage column
    assert "stage" not in next(line for line in out.splitlines() if line.startswith("run "))


# --- --sort ------------------------------------------------------------------------------------------------------
def test_sort(store, capsys):
    for lr, acc, loss in (("0.01", 0.8, 0.5), ("1e-3", 0.9, 0.3), ("0.1", 0.7, 0.2)):
        store.run("e", {"lr": lr}, {"val/acc": curve([acc]), "val/loss": curve([loss])}, config=ACC_CONFIG)

    def order(*args: str) -> list[str]:
        return [r["params.lr"] for r in store.rows(capsys, *args)]

    assert order() == ["0.1", "1e-3", "0.01"]  # newest first
    assert order("--sort", "best") == ["1e-3", "0.01", "0.1"]  # val/acc: higher first
    assert order("--sort", "best:asc") == ["0.1", "0.01", "1e-3"]
    assert order("--sort", "params.lr") == ["1e-3", "0.01", "0.1"]  # as numbers (as text 1e-3 would be last)
    assert order("--sort", "params.lr:desc") == ["0.1", "0.01", "1e-3"]
    assert order("--sort", "metrics.val/loss") == ["0.1", "1e-3", "0.01"]  # a loss: lower first
    assert order("--sort", "start:asc") == ["0.01", "1e-3", "0.1"]
    assert order("--metric", "val/loss", "--sort", "best") == ["0.1", "1e-3", "0.01"]
    code, out, _ = store.compare(capsys, "--sort", "best")
    assert [line.split()[0] for line in table_lines(out)] == ["lr=1e-3", "lr=0.01", "lr=0.1"]
    for bad, says in (("nope", "unknown key"), ("best:up", "asc or desc"), ("params.nope", "no listed run")):
        code, out, err = store.compare(capsys, "--sort", bad)
        assert code == 2 and out == "" and len(err.splitlines()) == 1 and says in err


# --- --filter ----------------------------------------------------------------------------------------------------
def test_filter(store, capsys):
    lr_of = {store.run("e", {"lr": lr}, {"val/acc": curve([acc])}): lr
             for lr, acc in (("0.01", 0.8), ("0.0005", 0.9), ("0.1", 0.7), ("auto", 0.6))}

    def lrs(text: str) -> list[str]:
        return sorted(lr_of[r["id"]] for r in store.rows(capsys, "--metric", "val/acc", "--filter", text))

    assert lrs("params.lr > 0.001") == ["0.01", "0.1"]  # as numbers; "auto" is no number
    assert lrs("params.lr <= 0.01") == ["0.0005", "0.01"]
    assert lrs("params.lr = 0.010") == ["0.01"]
    assert lrs("params.lr = 'auto'") == ["auto"]  # MLflow's own syntax
    assert lrs("metrics.`val/acc` > 0.75") == ["0.0005", "0.01"]
    assert lrs("params.lr > 0.001 and metrics.`val/acc` > 0.75") == ["0.01"]
    code, out, err = store.compare(capsys, "--filter", "params.lr > 1")
    assert code == 2 and "no runs in any experiment with stage 'fit' matching --filter 'params.lr > 1'" in err
    for bad in ("params.lr >> 1", "metrics.val/acc > 0.5", "lr = 3", "params.lr > 1 or params.lr < 0"):
        code, out, err = store.compare(capsys, "--filter", bad)
        assert code == 2 and out == "", bad
        assert len(err.splitlines()) == 1 and err.startswith(f"recipes compare: error: --filter {bad!r}"), err
        assert "Traceback" not in err


# --- plot --------------------------------------------------------------------------------------------------------
def test_plot_legend_shows_the_labels(store, capsys, workdir):
    from recipes.compare.command import collect_tables, build_parser
    from recipes.compare.run_filter import parse_filter
    from recipes.compare.plot import plot_curves

    for lr in ("0.1", "0.01"):
        store.run("first", {"lr": lr, "seed": 0}, {"val/acc": curve([0.5, 0.6])}, config=ACC_CONFIG)
    store.run("second", {"batch_size": 8}, {"val/loss": curve([0.5, 0.4, 0.45])})
    store.run("second", {"batch_size": 16}, {"val/loss": curve([0.6, 0.5])})
    store.run("second", {"batch_size": 16}, {"test/loss": [(0, 0.5)]}, stage="test")
    code, _, err = store.compare(capsys, "--stage", "all", "--plot", "curves.png")
    data = (workdir / "curves.png").read_bytes()
    assert code == 0 and data[:8] == b"\x89PNG\r\n\x1a\n" and "plot: curves.png" in err
    args = build_parser().parse_args(["--tracking-uri", store.uri, "--stage", "all"])
    tables = collect_tables(store.client, args, parse_filter(None))
    fig = plot_curves(tables, workdir / "direct.png")
    legends = [[t.get_text() for t in ax.get_legend().get_texts()] for ax in fig.axes]
    assert legends == [["lr=0.01", "lr=0.1"], ["batch_size=16", "batch_size=8"]]  # the table's labels, fit runs
    assert [len(ax.get_lines()) for ax in fig.axes] == [2, 2]
    assert [list(line.get_ydata()) for line in fig.axes[1].get_lines()] == [[0.6, 0.5], [0.5, 0.4, 0.45]]
    assert [ax.get_ylabel() for ax in fig.axes] == ["val/acc", "val/loss"]  # each table's own metric


# --- errors and notes ---------------------------------------------------------------------------------------------
def test_max_runs_note_and_errors(store, capsys):
    for lr in ("0.1", "0.2", "0.3"):
        store.run("e", {"lr": lr}, {"val/loss": curve([0.5])})
    code, out, err = store.compare(capsys, "--format", "json", "--max-runs", "1")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["e-3"]  # valid JSON; the note on stderr
    assert "compare: showing the newest 1 of 3 matching runs of e; 2 left out (--max-runs 1)" in err
    code, out, err = store.compare(capsys, "--stage", "test")
    assert code == 2 and "no runs in any experiment with stage 'test'" in err and "(try --stage all)" in err
    code, out, err = store.compare(capsys, "--experiment", "nope")
    assert code == 2 and "experiment 'nope' not found" in err and "known: Default, e" in err
    code, out, err = store.compare(capsys, "--metric", "val/nothing")
    assert code == 2 and "metric 'val/nothing' was not logged" in err


@pytest.mark.fresh_store  # asserts about the store's creation (or its absence)
def test_tracking_uri_names_another_store(workdir, capsys):
    assert main([]) == 2  # the fresh working directory has no mlflow.db, and none is created
    assert "no MLflow database" in capsys.readouterr().err
    assert not (workdir / "mlflow.db").exists()


def test_unreachable_server_exits_2(workdir, capsys):
    assert main(["--tracking-uri", "http://127.0.0.1:1"]) == 2
    assert "http://127.0.0.1:1" in capsys.readouterr().err


def test_a_server_that_does_not_answer_is_one_short_line_naming_the_reason_and_the_fix(workdir, capsys):
    """Issue 30: the line held urllib3's whole wrapping (HTTPConnectionPool(...): Max retries exceeded ...)."""
    port = free_port()  # nothing listens there
    assert main(["--tracking-uri", f"http://127.0.0.1:{port}"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"recipes compare: error: the MLflow tracking server at http://127.0.0.1:{port} does not "
                           "answer ([Errno 111] Connection refused); start it")
    assert "HTTPConnectionPool" not in line and "Max retries" not in line


def test_sweep_trials_still_compare(store, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parent = store.run("e", {"sweep.metric": "val/acc", "sweep.direction": "maximize"}, stage="sweep",
                       tags={"loopwise.sweep.role": "parent", "loopwise.sweep.study": "study-1"})
    for trial, (lr, values) in enumerate((("0.01", [0.5, 0.8]), ("0.001", [0.9, 0.7]))):
        store.run("e", {}, {"val/acc": curve(values)}, tags={
            "mlflow.parentRunId": parent, "loopwise.sweep.trial": str(trial),
            "loopwise.sweep.params": json.dumps({LR: float(lr), "model.init_args.model.init_args.hidden": [64] * 9}),
        })
    rows = store.rows(capsys, "--sweep", "study-1")
    assert [(r["trial"], r["val/acc"], r[LR]) for r in rows] == [(1, 0.9, 0.001), (0, 0.8, 0.01)]
    code, out, _ = store.compare(capsys, "--sweep", "study-1")
    assert code == 0 and max(len(line) for line in out.splitlines()) <= 80 and "COMPLETE" in out
    assert out.splitlines()[0].split()[:3] == ["trial", "state", "val/acc"] and "lr" in out.splitlines()[0]


# --- one real recipe run ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recipe_run(clean_workdir):
    """One 3-epoch `recipes fit` of the spiral recipe (lr 0.05) in an embedded store, and its epoch lines."""
    from recipes.cli import main as cli_main

    printed = io.StringIO()
    with clean_workdir("compare") as directory, contextlib.redirect_stdout(printed):
        cli_main(["fit", "-c", str(SPIRAL), "--trainer.max_epochs", "3",
                  "--model.init_args.optimizer.init_args.lr", "0.05"])
    return directory, printed.getvalue()


@pytest.fixture
def in_recipe_store(recipe_run, monkeypatch):
    monkeypatch.chdir(recipe_run[0])
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return recipe_run


def test_a_recipe_run_its_metric_data_and_best_epoch(in_recipe_store, capsys, monkeypatch):
    directory, printed = in_recipe_store
    [run] = runs_of(directory, "spiral_mlp")
    assert main(["--format", "json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["metric"] == "val/acc"  # the recipe's monitored metric, from the run's config.yaml
    history = sorted(mlflow_client(directory).get_metric_history(run.info.run_id, "val/acc"), key=lambda m: m.step)
    best = max(history, key=lambda m: m.value)  # the first of equal bests
    assert row["best"] == best.value and row["last"] == history[-1].value and row["best step"] == best.step
    # best epoch: the epoch line that printed the best value (epoch lines count from 1)
    lines = {int(m.group(1)): m.group(0) for m in re.finditer(r"^epoch (\d+)/3 .*$", printed, re.M)}
    assert sorted(lines) == [1, 2, 3]
    assert f"val/acc {best.value:.4g}" in lines[row["best epoch"]]
    printed_acc = {n: float(re.search(r"val/acc (\S+)", line).group(1)) for n, line in lines.items()}
    assert all(printed_acc[n] < float(f"{best.value:.4g}") for n in printed_acc if n < row["best epoch"])
    # the data: train and val inputs with the digests MLflow holds
    digests = {i.tags[0].value: i.dataset.digest for i in run.inputs.dataset_inputs}
    assert set(digests) == {"train", "val"} and row["data"] == "same"
    assert row["data inputs"] == f"SpiralDataModule/train:{digests['train']}; SpiralDataModule/val:{digests['val']}"
    monkeypatch.setenv("COLUMNS", "80")
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("spiral_mlp: 1 fit run, val/acc (higher is better); data SpiralDataModule:")
    assert f"train {digests['train'][:8]} val {digests['val'][:8]}" in out.replace("\n  ", " ")
    assert max(len(line) for line in out.splitlines()) <= 80


def test_recipes_compare_is_a_subcommand_of_recipes(in_recipe_store, capsys):
    from recipes.cli import main as recipes_main

    with pytest.raises(SystemExit) as exc:
        recipes_main(["compare", "--format", "json", "--sort", "best"])
    assert exc.value.code == 0
    assert len(json.loads(capsys.readouterr().out)) == 1
