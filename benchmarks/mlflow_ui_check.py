"""MLflow UI check: a real recipe's run, model and charts as the MLflow UI shows them in a headless browser.

    python benchmarks/mlflow_ui_check.py                 # spiral_mlp for 3 epochs, then 5 pages
    python benchmarks/mlflow_ui_check.py --quick         # 1 epoch
    python benchmarks/mlflow_ui_check.py --json out.json

In a fresh directory: ``recipes fit -c configs/spiral_mlp.yaml`` (its own ./mlflow.db), then ``mlflow server`` on
that store, then Debian's ``/usr/bin/chromium --headless`` (no Python driver: ``--screenshot`` and ``--dump-dom``
after a ``--virtual-time-budget``, a fresh profile per page, so a first-time visitor's empty localStorage) opens:

  a experiment   #/experiments/<id>                          (the README's link)
  b experiment_ml #/experiments/<id>?workflowType=machine_learning
  c run_charts   #/experiments/<id>/runs/<run_id>/model-metrics?workflowType=machine_learning
  d models       #/experiments/<id>/models?workflowType=machine_learning   (the experiment's logged models)
  e model        #/experiments/<id>/models/<model_id>?workflowType=machine_learning

Screenshots (1600x1000) go to benchmarks/results/mlflow_ui_check/; from each page's DOM it records: the view (GenAI or
"Model training", told by the sidebar's Docs link: docs/latest/genai/ or docs/latest/ml/), the route the page ended
on (the Settings link's returnTo), the chart sections and charts in order (c, read from a 1600x6000 window so that
every section renders), the model's name (d, e) and the datasets the model page lists (e). Without
/usr/bin/chromium it prints why it skips and exits 0.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "results" / "mlflow_ui_check"
CHROMIUM = Path("/usr/bin/chromium")
WINDOW = "1600,1000"


def run_recipe(workdir: Path, epochs: int) -> float:
    """``recipes fit`` of spiral_mlp in ``workdir`` (its own ./mlflow.db); seconds it took."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "recipes", "fit", "-c", str(REPO / "configs" / "spiral_mlp.yaml"),
           "--trainer.max_epochs", str(epochs)]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"recipes fit failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return time.perf_counter() - start


def inspect_store(workdir: Path) -> dict:
    """What the recipe recorded, read with the MLflow client: experiment, run, logged model."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name("spiral_mlp")
    run = client.search_runs([exp.experiment_id])[0]
    models = client.search_logged_models([exp.experiment_id])
    model = models[0]
    return {"experiment_id": exp.experiment_id, "experiment_tags": dict(exp.tags),
            "run_id": run.info.run_id, "run_name": run.info.run_name, "metrics": sorted(run.data.metrics),
            "run_datasets": [d.dataset.name for d in run.inputs.dataset_inputs],
            "logged_models": [{"model_id": m.model_id, "name": m.name} for m in models],
            "model_id": model.model_id, "model_name": model.name,
            "model_metric_datasets": sorted({m.dataset_name for m in model.metrics or [] if m.dataset_name})}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, server: subprocess.Popen, timeout: float = 120.0) -> None:
    """Until ``url`` answers 200 (raises if the server exits or the time runs out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({server.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {timeout:.0f} s")


def browse(url: str, png: Path | None, window: str = WINDOW, budget_ms: int = 15000) -> str:
    """One headless chromium visit in a fresh profile: the DOM after ``budget_ms`` of virtual time (and a
    screenshot to ``png`` if given)."""
    with tempfile.TemporaryDirectory() as profile:
        cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--window-size={window}", f"--virtual-time-budget={budget_ms}",
               *([f"--screenshot={png}"] if png else []), "--dump-dom", url]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if out.returncode != 0 or "<html" not in out.stdout:
        raise RuntimeError(f"chromium failed on {url} ({out.returncode}):\n{out.stderr[-2000:]}")
    return out.stdout


def text_of(dom: str) -> str:
    """The page's visible text, its elements' texts joined by ' | '."""
    body = re.sub(r"<(style|script)\b.*?</\1>", "", dom, flags=re.S)
    return re.sub(r"(\s*\|\s*)+", " | ", html.unescape(re.sub(r"<[^>]+>", " | ", body)))


def page_facts(dom: str) -> dict:
    """Which view (GenAI / Model training) and route the page shows, its title and heading."""
    ret = re.search(r'href="#/settings/general\?returnTo=([^"&]*)', dom)
    view = ("GenAI" if "docs/latest/genai/" in dom else
            "Model training" if "docs/latest/ml/" in dom else "unknown")
    title = re.search(r"<title>([^<]*)</title>", dom)
    h2 = re.search(r"<h2\b.*?</h2>", dom, flags=re.S)
    return {"view": view, "route": urllib.parse.unquote(html.unescape(ret.group(1))) if ret else None,
            "title": title.group(1) if title else None,
            "heading": " ".join(text_of(re.sub(r"<svg\b.*?</svg>", "", h2.group(0), flags=re.S)).strip(" |").split())
            if h2 else None}


def check_pages(base: str, s: dict, out: Path) -> dict:
    """Screenshots and findings of the five pages (see the module's docstring)."""
    exp = f"{base}/#/experiments/{s['experiment_id']}"
    ml = "?workflowType=machine_learning"  # what the docs tell a user to open (or the sidebar's switch sets)
    pages = {"a_experiment": exp, "b_experiment_ml": f"{exp}{ml}",
             "c_run_charts": f"{exp}/runs/{s['run_id']}/model-metrics{ml}", "d_models": f"{exp}/models{ml}",
             "e_model": f"{exp}/models/{s['model_id']}{ml}"}
    found: dict[str, dict] = {}
    for name, url in pages.items():
        dom = browse(url, out / f"{name}.png")
        text = text_of(dom)
        facts = {"url": url, **page_facts(dom), "shows_run_name": s["run_name"] in text,
                 "runs_table": "| Run Name |" in text,
                 "png_kb": round((out / f"{name}.png").stat().st_size / 1024)}
        if name == "c_run_charts":
            tall = browse(url, None, window="1600,6000")  # every section renders in a tall window
            found_sections = re.findall(r"\| ([^|]+?) \| \((\d+)\) \| Add chart", text_of(tall))
            facts["sections"] = [f"{n} ({k})" for n, k in found_sections]
            facts["charts"] = [html.unescape(t) for t in re.findall(r'<h4[^>]*\btitle="([^"]+)"', tall)]
            order = [n for n, _ in found_sections]  # MLflow sorts the sections by the metric names' prefix
            early = [order.index(n) for n in ("train", "val") if n in order]
            late = [order.index(n) for n in ("doctor", "system", "lr") if n in order]
            facts["train_val_before_doctor_system"] = bool(early) and (not late or max(early) < min(late))
        if name == "d_models":
            facts["model_names"] = re.findall(r"\| #[0-9a-f]{6} \| ([^|]+?) \| (?:Ready|Pending|Failed)", text)
        if name == "e_model":
            facts["model_name"] = (facts["heading"] or "").split(" | ")[0] or None  # "<name> | Not registered"
            used = re.search(r"Datasets used \| (.*?) \| Model versions", text)
            facts["datasets_used"] = used.group(1) if used else None
        found[name] = facts
    return found


def main(argv: list[str] | None = None) -> dict:
    """Run the recipe, serve its store, visit the pages, print and return the findings."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 training epoch instead of 3; screenshots not kept")
    parser.add_argument("--json", type=Path, help="write the findings to this JSON file")
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} not found (apt-get install chromium)"
        print(f"mlflow_ui_check: skipped: {reason}")
        result = {"benchmark": "mlflow_ui_check", "skipped": reason}
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return result
    start = time.perf_counter()
    epochs = 1 if args.quick else 3
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        out = workdir / "screenshots" if args.quick else OUT  # --quick keeps the kept screenshots as they are
        out.mkdir(parents=True, exist_ok=True)
        fit_s = run_recipe(workdir, epochs)
        store = inspect_store(workdir)
        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", "sqlite:///mlflow.db",
             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", server)
            pages = check_pages(f"http://127.0.0.1:{port}", store, out)
        finally:
            os.killpg(server.pid, 15)  # the server's own process group: its uvicorn and job-runner children too
            server.wait(timeout=30)
    version = subprocess.run([str(CHROMIUM), "--version"], capture_output=True, text=True).stdout.strip()
    result = {"benchmark": "mlflow_ui_check", "epochs": epochs, "browser": version, "fit_s": round(fit_s, 1),
              "total_s": round(time.perf_counter() - start, 1), "store": store, "pages": pages}
    print(f"mlflow_ui_check: {version}, spiral_mlp {epochs} epoch(s), fit {fit_s:.1f} s, "
          f"total {result['total_s']:.1f} s; screenshots in {'a temporary folder' if args.quick else OUT.relative_to(REPO)}")
    print(f"store: experiment {store['experiment_id']} tags {store['experiment_tags']}; run {store['run_id']} "
          f"'{store['run_name']}'; logged models {store['logged_models']}")
    print(f"  run metrics: {', '.join(store['metrics'])}; model's metric datasets: {store['model_metric_datasets']}")
    for name, f in pages.items():
        route = (f["route"] or "").split("&")[0]
        print(f"{name}: view {f['view']}, route {route}, {f['png_kb']} KB\n  title {f['title']!r}, heading "
              f"{f['heading']!r}, runs table {f['runs_table']}, run name shown {f['shows_run_name']}")
        if "sections" in f:
            print(f"  sections in order: {', '.join(f['sections'])}")
            print(f"  charts in order: {', '.join(f['charts']) or '(not rendered in the time budget)'}")
            print(f"  train/val sections before doctor, lr, system: {f['train_val_before_doctor_system']}")
        for key in ("model_names", "model_name", "datasets_used"):
            if key in f:
                print(f"  {key}: {f[key]}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
