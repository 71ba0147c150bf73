"""The parts of `recipes compare` that need no store: names, labels, filters, sorting, the fitted text table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.entities import Metric

from recipes.compare.errors import CompareError
from recipes.compare.run_filter import parse_filter, split_clauses
from recipes.compare.labels import differing_params, run_labels, short_names, short_value
from recipes.compare.metric import lower_is_better, summarize_history
from recipes.compare.report import human_duration
from recipes.compare.sort import parse_sort, sorted_order
from recipes.compare.table import Column, render_table


def fake_run(params: dict, run_id: str = "0" * 32, name: str = "r") -> SimpleNamespace:
    return SimpleNamespace(data=SimpleNamespace(params=params), info=SimpleNamespace(run_id=run_id, run_name=name))


def test_metric_direction_and_summary():
    assert lower_is_better("val/loss") and lower_is_better("val/rmse") and lower_is_better("val/ppl")
    assert not lower_is_better("val/acc") and not lower_is_better("val/f1")
    history = [Metric("val/acc", v, 0, s) for s, v in ((0, 0.5), (1, 0.9), (2, 0.9), (3, 0.8))]
    assert summarize_history(history, "val/acc") == {"best": 0.9, "last": 0.8, "best_step": 1}  # first of ties
    assert summarize_history(history, "val/error") == {"best": 0.5, "last": 0.8, "best_step": 0}
    assert summarize_history([], "val/acc")["best"] is None


def test_short_names_are_the_shortest_unambiguous_suffix():
    keys = ["model.init_args.optimizer.init_args.lr", "batch_size", "plan.batch_size", "schedule.warmup_steps",
            "plan.warmup_steps", "seed"]
    assert short_names(keys) == {"model.init_args.optimizer.init_args.lr": "lr", "batch_size": "batch_size",
                                 "plan.batch_size": "plan.batch_size", "schedule.warmup_steps": "schedule.warmup_steps",
                                 "plan.warmup_steps": "plan.warmup_steps", "seed": "seed"}
    assert short_names(["a.init_args.b", "a.b"]) == {"a.init_args.b": "a.init_args.b", "a.b": "a.b"}


def test_labels_leave_out_derived_and_repeated_params():
    runs = [fake_run({"lr": "0.1", "batch_size": "32", "effective_batch_size": "32", "plan.batches_per_epoch": "40",
                      "hidden": "[64, 64]", "seed": "0"}, "a" * 32),
            fake_run({"lr": "0.1", "batch_size": "64", "effective_batch_size": "64", "plan.batches_per_epoch": "20",
                      "hidden": "[64, 64]", "seed": "0"}, "b" * 32),
            fake_run({"lr": "0.3", "batch_size": "64", "effective_batch_size": "64", "plan.batches_per_epoch": "20",
                      "seed": "0"}, "c" * 32)]
    assert differing_params(runs) == ["batch_size", "effective_batch_size", "hidden", "lr", "plan.batches_per_epoch"]
    labels, named = run_labels(runs, ["fit"] * 3)
    assert labels == ["batch_size=32 hidden=[64,64] lr=0.1", "batch_size=64 hidden=[64,64] lr=0.1",
                      "batch_size=64 hidden=(none) lr=0.3"]
    assert named == ["batch_size", "hidden", "lr"]
    only_derived = [fake_run({"plan.epochs": "2"}), fake_run({"plan.epochs": "3"})]
    assert run_labels(only_derived, ["fit", "fit"])[0] == ["epochs=2", "epochs=3"]
    assert short_value("0.30000000000000004") == "0.3" and short_value("1e-3") == "1e-3"
    assert short_value("x" * 40) == "x" * 23 + "…"


def test_filter_parsing():
    assert split_clauses("params.lr > 0.001 and tags.`a and b` = 'x and y' AND metrics.`val/acc`>0.5") == [
        "params.lr > 0.001", "tags.`a and b` = 'x and y'", "metrics.`val/acc`>0.5"]
    parsed = parse_filter("params.lr > 1e-3 and params.`batch_size` = 64 and params.opt = 'SGD'")
    assert parsed.mlflow == "params.opt = 'SGD'"
    assert [(c.key, c.op, c.value) for c in parsed.numeric] == [("lr", ">", 0.001), ("batch_size", "=", 64.0)]
    assert parsed.keeps(fake_run({"lr": "0.01", "batch_size": "64.0"}))
    assert not parsed.keeps(fake_run({"lr": "0.0001", "batch_size": "64"}))
    assert not parsed.keeps(fake_run({"lr": "auto", "batch_size": "64"}))
    stage = "tags.`loopwise.stage` = 'fit'"
    assert parsed.combined_with(stage) == f"{stage} and params.opt = 'SGD'"
    assert parse_filter(None).combined_with("") == "" and parse_filter("  ").numeric == ()
    with pytest.raises(CompareError, match="no 'or'"):
        parse_filter("params.lr > 1 or params.lr < 0")
    assert parse_filter("tags.note = 'this or that'").mlflow == "tags.note = 'this or that'"


def test_sort_order():
    assert parse_sort("best") == ("best", None) and parse_sort("params.lr:desc") == ("params.lr", True)
    with pytest.raises(CompareError):
        parse_sort("best:sideways")
    assert sorted_order(["0.1", "1e-3", None, "0.01"], False) == [1, 3, 0, 2]  # numbers as numbers, missing last
    assert sorted_order(["0.1", "1e-3", None, "0.01"], True) == [0, 3, 1, 2]
    assert sorted_order(["b", "a", "b"], False) == [1, 0, 2] and sorted_order([2, 1, 2], True) == [0, 2, 1]  # stable


def test_render_table_fits_the_width_wrapping_then_leaving_out():
    rows = [{"run": "batch_size=64 lr=0.01 hidden=[128,128]", "id": "1234abcd", "start": "11-25 12:21", "best": 0.9149}]
    columns = [Column("run", "run", wrap=True, min_width=10), Column("id", "id"),
               Column("start", "started", drop=5), Column("best", "best", numeric=True)]
    lines, dropped = render_table(rows, columns, 200)
    assert dropped == [] and lines[0].split() == ["run", "id", "started", "best"] and len(lines) == 3
    lines, dropped = render_table(rows, columns, 40)
    assert dropped == ["started"] and max(map(len, lines)) <= 40
    assert lines[2].startswith("batch_size=64 lr=0.01") and lines[2].endswith("0.9149")
    assert lines[3].strip() == "hidden=[128,128]"  # the label's next line, indented by one
    lines, dropped = render_table(rows, columns, 35)  # the label as narrow as its longest word (+ indent)
    assert max(map(len, lines)) <= 35 and [line.split()[0] for line in lines[2:]] == [
        "batch_size=64", "lr=0.01", "hidden=[128,128]"] and lines[2].endswith("0.9149")
    lines, dropped = render_table(rows, columns, 20)  # too narrow for any layout: lines are cut
    assert max(map(len, lines)) <= 20 and lines[2].endswith("…")


def test_human_duration():
    assert [human_duration(s) for s in (None, 4.07, 184, 7500)] == ["", "4.1s", "3m04s", "2h05m"]
