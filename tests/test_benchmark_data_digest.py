"""benchmarks/data_digest.py runs in its quick mode and prints its ratios (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def test_data_digest_quick_prints_the_digest_against_read_csv(monkeypatch, workdir, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the script imports _common from its own folder
    spec = importlib.util.spec_from_file_location("data_digest", BENCHMARKS / "data_digest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--quick", "--dir", str(workdir / "tables"), "--json", str(workdir / "figures.json")])
    out = capsys.readouterr().out
    assert "table: 20,000 rows" in out and "digest / read_csv: " in out
    figures = json.loads((workdir / "figures.json").read_text())
    assert figures["digest_s"] > 0 and figures["read_csv_s"] > 0 and "test_s" not in figures
