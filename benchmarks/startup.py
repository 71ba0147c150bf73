"""Start-up: how long `recipes fit ... --trainer.fast_dev_run 1` takes beside importing torch and Lightning.

    python benchmarks/startup.py              # 3 interleaved repetitions of each command, fresh processes
    python benchmarks/startup.py --quick      # 1 repetition

Commands, each in a fresh Python process (interleaved: floor, import, smoke, floor, ...), in a fresh directory:

  floor    python -c "import torch, lightning"     (what any Lightning program pays)
  import   python -c "import recipes.cli"          (the command's own imports on top)
  smoke    python -m recipes fit -c configs/spiral_mlp.yaml --trainer.fast_dev_run 1

Prints median wall times, the ratios to the floor, the seconds our imports add (import - floor), and which heavy
optional libraries each command loads (mlflow, pandas, pyarrow, scikit-learn, matplotlib.pyplot): the command
loads them only where they are used (mlflow by the MLflow logger, which a fast_dev_run does not build).
No target ratio: the smoke run also parses the config, builds the trainer and runs one step; the import check
is a test (tests/test_benchmarks.py).
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
HEAVY = ["mlflow", "pandas", "pyarrow", "sklearn", "matplotlib.pyplot", "scipy"]
PROBE = ("import sys, json; print('LOADED ' + json.dumps([m for m in {heavy!r} if m in sys.modules]))")


def commands() -> dict[str, list[str]]:
    probe = PROBE.format(heavy=HEAVY)
    fit = ("import sys; sys.argv = ['recipes', 'fit', '-c', {config!r}, '--trainer.fast_dev_run', '1']\n"
           "from recipes.cli import main\nmain()\n").format(config=str(REPO / "configs" / "spiral_mlp.yaml"))
    return {
        "floor": [sys.executable, "-c", f"import torch, lightning\n{probe}"],
        "import": [sys.executable, "-c", f"import recipes.cli\n{probe}"],
        "smoke": [sys.executable, "-c", f"{fit}{probe}"],
    }


def run(cmd: list[str], cwd: Path) -> tuple[float, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cwd.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    loaded = next((json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("LOADED ")), [])
    return seconds, loaded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repetition")
    parser.add_argument("--json", type=Path, help="write the medians and ratios to this JSON file")
    args = parser.parse_args(argv)
    repeats = 1 if args.quick else args.repeats
    cmds = commands()
    times: dict[str, list[float]] = {name: [] for name in cmds}
    loaded: dict[str, list[str]] = {}
    print(f"startup: {repeats} repetition(s) of each command, fresh processes, interleaved")
    with tempfile.TemporaryDirectory() as tmp:
        run(cmds["floor"], Path(tmp) / "warm")  # file-system cache
        for rep in range(repeats):
            for name, cmd in cmds.items():
                seconds, loaded[name] = run(cmd, Path(tmp) / f"{name}-{rep}")
                times[name].append(seconds)
                print(f"  rep {rep + 1}/{repeats} {name:>6}: {seconds:6.2f} s", flush=True)
    med = {name: statistics.median(v) for name, v in times.items()}
    print()
    for name in cmds:
        runs = ", ".join(f"{t:.2f}" for t in times[name])
        heavy = ", ".join(loaded.get(name, [])) or "none"
        print(f"{name:>6}: median {med[name]:6.2f} s  ({med[name] / med['floor']:.2f}x the floor)  runs: {runs}  "
              f"heavy libraries loaded: {heavy}")
    print(f"our imports add {med['import'] - med['floor']:.2f} s to the floor; the fast_dev_run smoke takes "
          f"{med['smoke'] / med['floor']:.2f}x the floor ({med['smoke'] - med['floor']:.2f} s more)")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "startup", "median_s": med, "loaded": loaded,
                                         "smoke_over_floor": med["smoke"] / med["floor"]}, indent=2))


if __name__ == "__main__":
    main()
