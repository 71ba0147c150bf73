"""Install footprint: what `pip install loopwise` adds to torch + lightning + torchmetrics, on disk and at import.

    python benchmarks/install_footprint.py            # 3 fresh venvs, 7 interleaved import timings each
    python benchmarks/install_footprint.py --quick    # 2 timings each
    python benchmarks/install_footprint.py --keep DIR # build the venvs in DIR and leave them there

Three fresh venvs side by side (``python -m venv`` in a temporary folder, one shared pip cache), each with torch 2.13.0
named in the same pip command (the CPU wheel this machine carries; pip never picks a CUDA build):

  baseline  pip install torch==2.13.0 lightning torchmetrics       (what a Lightning user already has)
  core      pip install torch==2.13.0 <checkout>                   (`pip install loopwise`, not editable)
  recipes   pip install torch==2.13.0 "<checkout>[recipes]"        (the `recipes` command's stack)

<checkout> is a copy of this repository's HEAD (``git archive``), so nothing is built in the work tree and
uncommitted edits are not measured. Per venv: installed distributions (``pip list``), the size of site-packages on
disk (``du``), which of mlflow, optuna, sqlalchemy, jsonargparse, scipy and matplotlib are installed; then the wall
time of ``python -c "import lightning"`` (and, in core and recipes, of ``import lightning_modules, datamodules``)
in fresh processes, interleaved (baseline, core, recipes, baseline, ...) after one untimed warm-up each: median and
min-max. torchmetrics imports scipy and matplotlib whenever they are installed, so an install that brings them slows
every ``import lightning`` in that environment. Checks (PASS/FAIL): ``import lightning_modules, datamodules`` leaves
none of mlflow, optuna, sqlalchemy, jsonargparse in ``sys.modules`` (core, and recipes where they are installed),
and in core a ``ClassificationModule`` trains one epoch on ``SpiralDataModule`` under a plain
``lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False)``.

Needs the package registry (pip downloads lightning and the rest); without it, one line says so and the exit code
is 2. No timing target: the issue (54) asks for the figures beside each other.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"
VENVS = ["baseline", "core", "recipes"]
#: the recipes' stack that the core must neither install nor import
RECIPES_STACK = ["mlflow", "optuna", "sqlalchemy", "jsonargparse"]
#: installed or not, per venv (scipy and matplotlib: what torchmetrics imports when it finds them)
WATCHED = [*RECIPES_STACK, "scipy", "matplotlib"]
IMPORTS = {"lightning": "import lightning", "modules": "import lightning_modules, datamodules"}
#: which import runs in which venv (baseline has no loopwise)
TIMED = [("lightning", "baseline"), ("lightning", "core"), ("lightning", "recipes"), ("modules", "core"),
         ("modules", "recipes")]
PROBE_HEAVY = ["scipy", "matplotlib", "sklearn", "pandas", "pyarrow", "PIL", *RECIPES_STACK]
LIGHT_CHECK = """
import sys, json
import lightning, torch
import lightning_modules, datamodules
stack = {stack!r}
after_import = sorted(m for m in stack if m in sys.modules)
out = {{"after_import": after_import}}
if {train!r}:
    from lightning_modules import ClassificationModule
    from lightning_modules.models import MLP
    from datamodules import SpiralDataModule
    torch.manual_seed(0)
    data = SpiralDataModule(n_samples=600, batch_size=32)
    task = ClassificationModule(model=MLP(in_features=2, out_features=3, hidden_sizes=[32]), num_classes=3)
    trainer = lightning.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu")
    trainer.fit(task, datamodule=data)
    out["epochs"] = trainer.current_epoch
    out["global_step"] = trainer.global_step
    out["after_fit"] = sorted(m for m in stack if m in sys.modules)
print("CHECK " + json.dumps(out))
"""


class InstallFailed(RuntimeError):
    """pip could not install a venv's packages (most often: no package registry)."""


def env_for_children() -> dict[str, str]:
    """The environment of every child: no PYTHONPATH (the checkout must come from the venv), no tracking URI."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MLFLOW_TRACKING_URI", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def copy_checkout(dest: Path) -> Path:
    """HEAD of this repository, unpacked in ``dest`` (``git archive``: tracked, committed files only)."""
    archive = dest.with_suffix(".tar")
    subprocess.run(["git", "archive", "--format=tar", "-o", str(archive), "HEAD"], cwd=REPO, check=True)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.11.4
            tar.extractall(dest)
    archive.unlink()
    return dest


def requirements(name: str, checkout: Path) -> list[str]:
    return {"baseline": [TORCH, "lightning", "torchmetrics"], "core": [TORCH, str(checkout)],
            "recipes": [TORCH, f"{checkout}[recipes]"]}[name]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def make_venv(venv: Path, packages: list[str], env: dict[str, str]) -> float:
    """A fresh venv with ``packages``; seconds the pip install took (the shared cache makes later ones faster)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    start = time.perf_counter()
    done = subprocess.run([str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "-q", "install",
                           *packages], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        last = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1] if lines else "")
        raise InstallFailed(f"pip install {' '.join(packages)} failed in {venv.name} (exit {done.returncode}): {last}")
    return time.perf_counter() - start


def site_packages(venv: Path) -> Path:
    [found] = list((venv / "lib").glob("python*/site-packages"))
    return found


def disk_mb(path: Path) -> float:
    """Disk usage of ``path`` as ``du`` counts it, in MB (10^6 bytes)."""
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 1024 / 1e6


def footprint(venv: Path, env: dict[str, str]) -> dict:
    """Installed distributions, site-packages MB, which watched packages are installed, key versions."""
    listed = json.loads(subprocess.run([str(venv_python(venv)), "-m", "pip", "--disable-pip-version-check", "list",
                                        "--format", "json"], env=env, capture_output=True, text=True,
                                       check=True).stdout)
    versions = {d["name"].lower().replace("_", "-"): d["version"] for d in listed}
    return {"packages": len(listed), "mb": round(disk_mb(site_packages(venv)), 1),
            "installed": [name for name in WATCHED if name in versions],
            "versions": {name: versions.get(name) for name in ("torch", "lightning", "torchmetrics", "loopwise")
                         if versions.get(name)}}


def children_cpu() -> float:
    """User + system CPU seconds of this process's finished children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_python(venv: Path, code: str, cwd: Path, env: dict[str, str]) -> tuple[float, str, float]:
    """Wall seconds of ``python -c code`` in the venv, its stdout and its CPU seconds (user + system: what another
    busy process on the machine does not inflate much); raises on a non-zero exit."""
    cpu = children_cpu()
    start = time.perf_counter()
    done = subprocess.run([str(venv_python(venv)), "-c", code], cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    cpu = children_cpu() - cpu
    if done.returncode != 0:
        raise RuntimeError(f"{venv.name}: python -c {code[:60]!r}... failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return seconds, done.stdout, cpu


def heavy_loaded(venv: Path, statement: str, cwd: Path, env: dict[str, str]) -> list[str]:
    """Which heavy libraries ``statement`` imports in the venv (the untimed warm-up run)."""
    probe = (f"{statement}\nimport sys, json\n"
             f"print('LOADED ' + json.dumps([m for m in {PROBE_HEAVY!r} if m in sys.modules]))")
    _, out, _ = run_python(venv, probe, cwd, env)
    return next((json.loads(line[7:]) for line in out.splitlines() if line.startswith("LOADED ")), [])


def light_check(venv: Path, train: bool, cwd: Path, env: dict[str, str]) -> dict:
    """The modules import none of the recipes' stack; with ``train``, a plain Trainer fits one epoch."""
    try:
        _, out, _ = run_python(venv, LIGHT_CHECK.format(stack=RECIPES_STACK, train=train), cwd, env)
    except RuntimeError as error:
        return {"passed": False, "error": str(error)[-1500:]}
    result = next((json.loads(line[6:]) for line in out.splitlines() if line.startswith("CHECK ")), {})
    passed = result.get("after_import") == [] and (not train or (result.get("after_fit") == []
                                                                 and result.get("epochs") == 1
                                                                 and result.get("global_step", 0) > 0))
    return {**result, "passed": passed}


def summary(times: list[float]) -> dict:
    return {"median": statistics.median(times), "min": min(times), "max": max(times), "runs": times}


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def format_table(m: dict) -> str:
    """The readable table: per venv, then the ratios to the baseline and what each install adds to it."""
    venvs, imports = m["venvs"], m["imports"]
    n = len(next(iter(imports["lightning"].values()))["runs"])
    head = (f"{'venv':<9} {'packages':>8} {'site-packages':>14} {'import lightning (min-max)':>27} "
            f"{'import modules (min-max)':>25}  installed of {', '.join(WATCHED)}")
    lines = [head, "-" * len(head)]
    for name in VENVS:
        v = venvs[name]
        cells = []
        for what in ("lightning", "modules"):
            t = imports[what].get(name)
            cells.append(f"{t['median']:.2f} s ({t['min']:.2f}-{t['max']:.2f})" if t else "-")
        lines.append(f"{name:<9} {v['packages']:>8} {v['mb']:>11,.0f} MB {cells[0]:>27} {cells[1]:>25}  "
                     f"{', '.join(v['installed']) or 'none'}")
    lines.append("")
    base = venvs["baseline"]
    base_import = imports["lightning"]["baseline"]["median"]
    for name in ("core", "recipes"):
        v, t = venvs[name], imports["lightning"][name]["median"]
        lines.append(f"{name} / baseline: packages {ratio(v['packages'], base['packages']):.2f}x, "
                     f"MB {ratio(v['mb'], base['mb']):.2f}x, import lightning {ratio(t, base_import):.2f}x   "
                     f"(adds {v['packages'] - base['packages']:+d} packages, {v['mb'] - base['mb']:+,.0f} MB, "
                     f"{t - base_import:+.2f} s to every import lightning)")
    if "cpu" in imports["lightning"]["baseline"]:  # CPU time: less at the mercy of other work on the machine
        base_cpu = imports["lightning"]["baseline"]["cpu"]["median"]
        lines.append("import lightning, CPU seconds (user + system, medians): " + ", ".join(
            f"{name} {imports['lightning'][name]['cpu']['median']:.2f}" for name in VENVS) + "; " + ", ".join(
            f"{name} / baseline {ratio(imports['lightning'][name]['cpu']['median'], base_cpu):.2f}x"
            for name in ("core", "recipes")))
    for name in ("core", "recipes"):
        t_mod, t_light = imports["modules"][name]["median"], imports["lightning"][name]["median"]
        lines.append(f"{name}: import lightning_modules, datamodules / import lightning = {ratio(t_mod, t_light):.2f}x "
                     f"({t_mod - t_light:+.2f} s)")
    lines.append(f"(medians of {n} fresh processes per cell, interleaved; min-max in brackets)")
    for what, by_venv in m.get("loaded", {}).items():
        lines.append(f"heavy libraries `{IMPORTS[what]}` loads: " + "; ".join(
            f"{name} {', '.join(found) or 'none'}" for name, found in by_venv.items()))
    for name, check in m.get("checks", {}).items():
        lines.append(check_line(name, check))
    return "\n".join(lines)


def check_line(name: str, check: dict) -> str:
    verdict = "PASS" if check.get("passed") else "FAIL"
    if "error" in check:
        return f"{verdict}: {name}: {check['error'].strip().splitlines()[-1]}"
    text = (f"{verdict}: {name}: import lightning_modules, datamodules loads "
            f"{', '.join(check.get('after_import', [])) or 'none'} of {', '.join(RECIPES_STACK)}")
    if "epochs" in check:
        text += (f"; a ClassificationModule fits {check['epochs']} epoch ({check['global_step']} steps) on "
                 f"SpiralDataModule under a plain lightning.Trainer, after which "
                 f"{', '.join(check.get('after_fit', [])) or 'none'} of them are loaded")
    return text


def json_rows(m: dict) -> list[dict]:
    """Rows for run_all's table: what, result, target, verdict."""
    venvs, imports = m["venvs"], m["imports"]
    base, base_t = venvs["baseline"], imports["lightning"]["baseline"]
    rows = []
    for name in ("core", "recipes"):
        v, t = venvs[name], imports["lightning"][name]
        extra = "`pip install loopwise`" if name == "core" else "`pip install loopwise[recipes]`"
        rows.append({"what": f"{extra} / torch + lightning + torchmetrics: installed packages ({v['packages']} vs "
                             f"{base['packages']}, {v['packages'] - base['packages']:+d}), site-packages MB "
                             f"({v['mb']:,.0f} vs {base['mb']:,.0f}, {v['mb'] - base['mb']:+,.0f})",
                     "result": f"{ratio(v['packages'], base['packages']):.2f}x, {ratio(v['mb'], base['mb']):.2f}x",
                     "target": "-", "verdict": "-"})
        rows.append({"what": f"`import lightning` after {extra} / torch + lightning + torchmetrics (median "
                             f"{t['median']:.2f} s, {t['min']:.2f}-{t['max']:.2f}, vs {base_t['median']:.2f} s, "
                             f"{base_t['min']:.2f}-{base_t['max']:.2f}"
                             + (f"; CPU time {ratio(t['cpu']['median'], base_t['cpu']['median']):.2f}x" if "cpu" in t
                                else "") + ")",
                     "result": f"{ratio(t['median'], base_t['median']):.2f}x", "target": "-", "verdict": "-"})
    stack_installed = [p for p in venvs["core"]["installed"] if p in RECIPES_STACK]
    rows.append({"what": "the core install's packages of the recipes' stack (" + ", ".join(RECIPES_STACK) + ")",
                 "result": ", ".join(stack_installed) or "none", "target": "none",
                 "verdict": "met" if not stack_installed else "not met"})
    for name, check in m.get("checks", {}).items():
        rows.append({"what": check_line(name, check).split(": ", 1)[1], "result": "PASS" if check.get("passed")
                     else "FAIL", "target": "PASS", "verdict": "met" if check.get("passed") else "not met"})
    return rows


def header() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import commit, cpu_model

    import platform

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"install_footprint: {stamp}, {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"commit {commit()} (HEAD, installed from a git archive copy), load average {load}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="timed imports per venv and command (default 7)")
    parser.add_argument("--quick", action="store_true", help="2 timed imports per venv and command")
    parser.add_argument("--json", type=Path, help="write the measurements and run_all's rows to this JSON file")
    parser.add_argument("--keep", type=Path, help="build the venvs in this (new) folder and leave them there")
    args = parser.parse_args(argv)
    repeats = 2 if args.quick else args.repeats
    print(header(), flush=True)
    env = env_for_children()
    if args.keep:
        args.keep.mkdir(parents=True)
        root, cleanup = args.keep.resolve(), None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="install_footprint-")
        root = Path(cleanup.name)
    try:
        return measure(root, repeats, env, args.json)
    except InstallFailed as error:
        print(f"install_footprint: cannot build the venvs, pip needs the package registry: {error}", flush=True)
        return 2
    finally:
        if cleanup is not None:
            cleanup.cleanup()


def measure(root: Path, repeats: int, env: dict[str, str], json_path: Path | None) -> int:
    checkout = copy_checkout(root / "checkout")
    work = root / "cwd"  # the children's working directory: nothing importable in it
    work.mkdir()
    venvs: dict[str, dict] = {}
    for name in VENVS:
        packages = requirements(name, checkout)
        print(f"{name}: pip install {' '.join(p.replace(str(root), '<tmp>') for p in packages)}", flush=True)
        seconds = make_venv(root / name, packages, env)
        venvs[name] = {**footprint(root / name, env), "install_s": round(seconds, 1)}
        v = venvs[name]
        print(f"  {seconds:.0f} s; {v['packages']} packages, {v['mb']:,.0f} MB; "
              f"{', '.join(f'{k} {x}' for k, x in v['versions'].items())}; installed of the watched: "
              f"{', '.join(v['installed']) or 'none'}", flush=True)
    shutil.rmtree(checkout)
    loaded: dict[str, dict[str, list[str]]] = {what: {} for what in IMPORTS}
    for what, name in TIMED:  # the untimed warm-ups (file-system cache), which say what each import loads
        loaded[what][name] = heavy_loaded(root / name, IMPORTS[what], work, env)
    times: dict[tuple[str, str], list[float]] = {pair: [] for pair in TIMED}
    cpu_times: dict[tuple[str, str], list[float]] = {pair: [] for pair in TIMED}
    print(f"timing: {repeats} fresh process(es) per cell, interleaved", flush=True)
    for rep in range(repeats):
        for what, name in TIMED:
            seconds, _, cpu = run_python(root / name, IMPORTS[what], work, env)
            times[(what, name)].append(seconds)
            cpu_times[(what, name)].append(cpu)
            print(f"  rep {rep + 1}/{repeats} {name:>8} {IMPORTS[what]}: {seconds:.2f} s (CPU {cpu:.2f} s)", flush=True)
    checks = {"core (plain Trainer)": light_check(root / "core", True, work, env),
              "recipes (stack installed)": light_check(root / "recipes", False, work, env)}
    imports: dict[str, dict] = {what: {} for what in IMPORTS}
    for (what, name), values in times.items():
        imports[what][name] = {**summary(values), "cpu": summary(cpu_times[(what, name)])}
    m = {"benchmark": "install_footprint", "repeats": repeats, "venvs": venvs, "imports": imports,
         "loaded": loaded, "checks": checks}
    print()
    print(format_table(m))
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    if json_path:
        json_path.write_text(json.dumps({**m, "rows": json_rows(m)}, indent=2))
    return 0  # a failed check is a FAIL line and a "not met" row, like a missed target


if __name__ == "__main__":
    sys.exit(main())
