#!/usr/bin/env bash
# The GPU device run of issue 33, as ONE prepared script (the device machine has no network and 15 minutes of
# device time in all; this script keeps itself under 7 minutes of wall time).
#
#   device run:  command "bash benchmarks/gpu_checks.sh", carry [".whl"], timeout_s 480
#   here:        OUT=/tmp/gpu_checks PYTHON=.venv/bin/python SITE=/tmp/gpu_checks_site bash benchmarks/gpu_checks.sh
#                (no CUDA: the benchmarks say they are skipped; the cp312 wheels do not install into Python 3.11)
#
# Steps, each under its own `timeout`, each tee'd to $OUT/<step>.txt; a step that fails does not stop the others:
#   info          nvidia-smi, versions, loopwise's requirements (pyproject) checked against what is importable
#   gpu           python benchmarks/gpu.py --repeats 2 (ConvNet raw loop vs recipe: fp32, bf16, compile) -> gpu.json
#   tests         the tests that only mean something on CUDA (CI skips them or sends them to the CPU)
#   augmentation  python benchmarks/augmentation.py --device cuda --quick (if the file exists) -> augmentation.json
#   gpu_images    python benchmarks/gpu_images.py (HF ResNet-18 / ViT-S fine-tuning images/s) -> gpu_images.json
#   (at the end)  each step's exit status and seconds, and the result lines (stdout only)
#
# Wheels carried in .whl/ (ignored through .git/info/exclude; fetched on the CPU machine with the command at the end
# of this block): what loopwise needs at run time that the device's image (Python 3.12.3,
# /opt/torch/.venv: torch 2.11.0+cu130, lightning 2.6.6, torchmetrics 1.9.0, transformers 5.17.0, pandas, pyarrow,
# scikit-learn, matplotlib, pillow, psutil, safetensors, pyyaml, ...) lacks, for cp312 manylinux x86_64, with every
# missing dependency, transitively (Requires-Dist checked against the device's package list). MLflow's embedded
# SQLite store comes from mlflow-skinny + sqlalchemy + alembic (the `mlflow` wheel, 11.5 MiB, adds the UI, Flask,
# gunicorn, docker, graphene, skops, huey: 34.4 MiB for MLflow alone against 19 MiB). optuna is not carried: only
# `recipes sweep` imports it. 35 wheels, 27.0 MiB:
#   mlflow_skinny-3.17.2 3.92 | sqlalchemy-2.1.9 4.53 | alembic-1.20.1 0.26 | mako-1.4.3 0.08 | sqlparse-0.6.1 0.05
#   databricks_sdk-0.162.0 1.12 | google_auth-2.63.0 0.26 | cryptography-50.0.2 4.53 | cffi-2.1.1 0.21
#   pycparser-3.12 0.06 | pyasn1-0.6.5 0.08 | pyasn1_modules-0.4.2 0.17 | fastapi-0.165.0 0.15 | starlette-1.10.0 0.08
#   uvicorn-0.54.0 0.08 | pydantic-2.14.4 0.47 | pydantic_core-2.50.5 2.16 | annotated_types-0.8.0 0.01
#   typing_inspection-0.4.5 0.01 | typing_extensions-4.16.0 0.04 (pydantic needs >= 4.16; the device's is unknown)
#   opentelemetry_api-1.45.2 0.06 | opentelemetry_sdk-1.45.2 0.14 | opentelemetry_proto-1.45.2 0.07
#   opentelemetry_semantic_conventions-0.66b2 0.20 | importlib_metadata-9.1.0 0.03 | cachetools-7.3.3 0.02
#   gitpython-3.2.1 0.22 | gitdb-4.0.12 0.06 | smmap-5.0.3 0.02 | python_dotenv-1.2.4 0.02
#   jsonargparse-4.53.0 0.17 | docstring_parser-0.18.0 0.02 | typeshed_client-2.15.0 0.77 (jsonargparse[signatures])
#   kornia-0.9.0 1.85 | kornia_rs-0.2.0 5.09 (datamodules.BatchAugmentation)
# Fetch them again (here, in the repository root):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     <each name==version above>
set -u
cd "$(dirname "$0")/.."
NAME=gpu_checks
BUDGET=405  # seconds for the steps after the wheels' install
source benchmarks/gpu_checks_common.sh  # OUT, PY, SITE; the wheels, the environment, step()

info() {
    nvidia-smi -L
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
    $PY - <<'EOF'
"""Versions, and loopwise's requirements (pyproject.toml) checked against what this Python imports."""
import os, sys, tomllib
from importlib.metadata import PackageNotFoundError, distribution
from packaging.requirements import Requirement

import torch
print(f"python {sys.version.split()[0]} ({sys.executable}); torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}, device: "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}; "
      f"bf16 {torch.cuda.is_available() and torch.cuda.is_bf16_supported()}")
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project.get("optional-dependencies", {})
wanted = [("", r) for r in project["dependencies"]]
wanted += [(e, r) for e in ("hf", "vision") for r in extras.get(e, [])]
bad = 0
for extra, text in wanted:
    req = Requirement(text)
    try:
        dist = distribution(req.name)
        where = "carried" if os.environ["SITE"] in str(dist.locate_file("")) else "device"
        ok = req.specifier.contains(dist.version, prereleases=True)
        state = "ok" if ok else "OUTSIDE THE RANGE"
        print(f"  {req.name:<22} {dist.version:<14} {where:<8} {str(req.specifier):<14} {state}"
              f"{' [' + extra + ']' if extra else ''}")
        bad += not ok
    except PackageNotFoundError:
        print(f"  {req.name:<22} {'-':<14} {'':<8} {str(req.specifier):<14} missing{' [' + extra + ']' if extra else ''}")
        bad += req.name not in ("optuna", "optuna-integration")  # only `recipes sweep` imports them
for name in ("typing_extensions", "protobuf", "packaging", "certifi", "huggingface_hub", "tokenizers", "numpy"):
    try:
        print(f"  ({name} {distribution(name).version})")
    except PackageNotFoundError:
        print(f"  ({name} missing)")
import mlflow, jsonargparse, kornia, recipes.cli  # noqa: E401,F401 (what the steps need imports)
from lightning_modules.models import HFImageClassifier  # noqa: F401
print(f"imports ok: mlflow {mlflow.__version__}, jsonargparse {jsonargparse.__version__}, kornia {kornia.__version__}; "
      f"{bad} requirement(s) not met")
EOF
}

cuda_tests() {
    # the tests skipped without CUDA (found by their skipif), and every recipe with the GPU trainer fragments (which
    # CI sends to the CPU); the image recipe joins them by itself once configs/image_finetune_hf.yaml exists
    local files names
    files=$(grep -rl --include='*.py' 'skipif(not torch.cuda.is_available()' tests | sort)
    # the decorated tests by name, and whole modules marked by a module-level pytestmark (-k matches module names)
    names=$( (grep -h -A4 --include='*.py' -r 'skipif(not torch.cuda.is_available()' tests \
        | grep -o 'def test_[A-Za-z0-9_]*' | sed 's/^def //'
        grep -l --include='*.py' -r '^pytestmark.*skipif(not torch.cuda.is_available()' tests | xargs -r -n1 basename \
        | sed 's/\.py$//') | sort -u | paste -sd' ' | sed 's/ / or /g')
    echo "CUDA-only tests: ${names:-none} in ${files//$'\n'/ }"
    $PY -m pytest -p no:xdist -o addopts="" -p no:cacheprovider -q -rs --durations=10 \
        $files tests/run/test_cli.py -k "${names:+$names or }gpu-bf16 or gpu-fp16"
}

export -f info cuda_tests
export PY SITE
step info 60 bash -c info
step gpu 170 $PY benchmarks/gpu.py --repeats 2 --json "$OUT/gpu.json"
step tests 70 bash -c cuda_tests
if [ -f benchmarks/augmentation.py ]; then
    step augmentation 35 $PY benchmarks/augmentation.py --device cuda --quick --json "$OUT/augmentation.json"
else
    SUMMARY+="augmentation: benchmarks/augmentation.py not in this tree"$'\n'
fi
step gpu_images 120 $PY benchmarks/gpu_images.py --max-seconds 112 --json "$OUT/gpu_images.json"

{
    echo "gpu_checks: $((SECONDS)) s in all"
    printf '%s' "$SUMMARY"
    grep -h -E "recipe / raw|bf16 \+ channels_last| / per-sample = |^[0-9]+ (passed|failed)|^(FAILED|ERROR) |Error|images/s \(median|x \(per repetition|loader alone|host syncs|requirement" \
        "$OUT"/info.txt "$OUT"/gpu.txt "$OUT"/tests.txt "$OUT"/augmentation.txt "$OUT"/gpu_images.txt 2>/dev/null | grep -v "^==" | tail -40
}  # printed only: $OUT holds at most 8 files that come back, the 8 above
