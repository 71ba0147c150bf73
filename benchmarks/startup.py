"""Start-up: how long the ``recipes`` command takes to answer and to reach its first training step.

    python benchmarks/startup.py              # 5 interleaved repetitions of each command, fresh processes
    python benchmarks/startup.py --quick      # 1 repetition

Commands, each in a fresh Python process, interleaved (torch, lightning+mlflow, help, ..., torch, ...), each in a
fresh directory (so ``fit`` makes its own embedded MLflow store, as a first fit does):

  torch             python -c "import torch"
  lightning_mlflow  python -c "import lightning, mlflow"
  help              python -m recipes --help                  (the list of commands)
  compare_help      python -m recipes compare --help          (a command that only reads a store)
  fit_help          python -m recipes fit --help
  first_step        python -m recipes fit -c configs/spiral_mlp.yaml, timed from the process's start to the start of
                    its first training step (``_common.FirstStepClock`` prints it and ends the process there)

Targets (issue 57), medians of the interleaved runs: ``help`` within 1.5x of ``torch``; ``fit_help`` within 1.2x and
``first_step`` within 2x of ``lightning_mlflow``. Also printed: which heavy libraries each command loaded (``help``
and ``compare_help`` load neither torch nor Lightning; a test checks it too: tests/test_cli_imports.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HEAVY = ["torch", "lightning", "mlflow", "pandas", "pyarrow", "sklearn", "matplotlib.pyplot", "scipy"]
PROBE = "import sys, json; print('LOADED ' + json.dumps([m for m in {heavy!r} if m in sys.modules]))"
FIRST_STEP = "FIRST_STEP "
#: (command, reference, largest ratio allowed)
TARGETS = [("help", "torch", 1.5), ("fit_help", "lightning_mlflow", 1.2), ("first_step", "lightning_mlflow", 2.0)]


def python_program(code: str) -> list[str]:
    return [sys.executable, "-c", f"{code}\n{PROBE.format(heavy=HEAVY)}"]


def recipes_program(args: list[str]) -> list[str]:
    """``recipes <args>`` with the heavy-library probe printed at exit (``--help`` ends the process by SystemExit)."""
    code = (f"import atexit\natexit.register(exec, {PROBE.format(heavy=HEAVY)!r}, {{}})\n"
            f"from recipes.cli import main\nmain({args!r})\n")
    return [sys.executable, "-c", code]


def commands() -> dict[str, list[str]]:
    config = str(REPO / "configs" / "spiral_mlp.yaml")
    clock = ["--trainer.callbacks+=_common.FirstStepClock"]
    return {
        "torch": python_program("import torch"),
        "lightning_mlflow": python_program("import lightning, mlflow"),
        "help": recipes_program(["--help"]),
        "compare_help": recipes_program(["compare", "--help"]),
        "fit_help": recipes_program(["fit", "--help"]),
        "first_step": recipes_program(["fit", "-c", config, *clock]),
    }


def run(cmd: list[str], cwd: Path) -> tuple[float, list[str]]:
    """Seconds the command took (for ``first_step``: to its first training step, as it printed) and the heavy
    libraries it had loaded."""
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    path = [str(REPO), str(REPO / "benchmarks"), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(path).rstrip(os.pathsep)
    env["STARTUP_CLOCK_HEAVY"] = json.dumps(HEAVY)
    cwd.mkdir(parents=True, exist_ok=True)
    env["STARTUP_CLOCK_T0"] = repr(time.time())  # FirstStepClock's start
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[-1][-200:]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    lines = out.stdout.splitlines()
    loaded = next((json.loads(line[7:]) for line in lines if line.startswith("LOADED ")), [])
    first_step = next((float(line[len(FIRST_STEP):]) for line in lines if line.startswith(FIRST_STEP)), None)
    return (seconds if first_step is None else first_step), loaded


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 repetition")
    parser.add_argument("--json", type=Path, help="write the medians and ratios to this JSON file")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    cmds = commands()
    times: dict[str, list[float]] = {name: [] for name in cmds}
    loaded: dict[str, list[str]] = {}
    print(f"startup: {repeats} repetition(s) of each command, fresh processes, interleaved")
    with tempfile.TemporaryDirectory() as tmp:
        run(cmds["lightning_mlflow"], Path(tmp) / "warm")  # file-system cache
        for rep in range(repeats):
            for name, cmd in cmds.items():
                seconds, loaded[name] = run(cmd, Path(tmp) / f"{name}-{rep}")
                times[name].append(seconds)
                print(f"  rep {rep + 1}/{repeats} {name:>16}: {seconds:6.2f} s", flush=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    print()
    for name in cmds:
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        spread = (max(times[name]) - min(times[name])) / med[name] if med[name] else 0.0
        heavy = ", ".join(loaded.get(name, [])) or "none"
        print(f"{name:>16}: median {med[name]:6.2f} s  runs: {runs}  (spread {spread:.0%})  loaded: {heavy}")
    print()
    ratios = []
    for name, reference, limit in TARGETS:
        ratio = med[name] / med[reference]
        ratios.append({"command": name, "reference": reference, "ratio": ratio, "target": limit,
                       "met": ratio <= limit})
        print(f"{name} / {reference}: {ratio:.2f}x (target <= {limit}x: {'met' if ratio <= limit else 'NOT met'})")
    result = {"benchmark": "startup", "repeats": repeats, "median_s": med, "runs_s": times, "loaded": loaded,
              "ratios": ratios}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
