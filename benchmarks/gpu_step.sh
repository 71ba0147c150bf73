#!/usr/bin/env bash
# The GPU device run of issue 58, point 4, as ONE prepared script: the recipe's training step beside a hand-written
# loop of the same network, in bf16 + channels_last and in fp32, on the three networks the issue names, with the host
# syncs of ordinary steps checked. Under 7 minutes of wall time (every step's timeout is cut to what is left of
# 390 s after the wheels are installed; a lent device gives 15 minutes in all, its start included).
#
#   device run:  command "bash benchmarks/gpu_step.sh", carry [".whl"], timeout_s 480
#   here:        OUT=/tmp/gpu_step PYTHON=.venv/bin/python SITE=/tmp/gpu_step_site bash benchmarks/gpu_step.sh
#                (no CUDA: each step says it is skipped and exits 0)
#
# Steps, each under its own `timeout`, each tee'd to $OUT/<step>.txt with its JSON beside it; a step that fails does
# not stop the others:
#   info       the GPU, the driver, Python, torch, CUDA, lightning, transformers                          (~10 s)
#   convnet    gpu.py --network convnet: ConvNet 3x32x32, batch 256; raw loop and the recipe in fp32,
#              bf16 + channels_last and bf16 + torch.compile, 2 interleaved repetitions                (~90 s)
#   resnet18   gpu.py --network resnet18: transformers' ResNet-18 (basic blocks, random weights), 224 px, batch 128;
#              raw loop and recipe in fp32 and bf16 + channels_last, 2 repetitions                     (~110 s)
#   vit_s      gpu.py --network vit_s: ViT-S/16 (384 wide, 12 layers, 6 heads), 224 px, batch 128; the same  (~120 s)
#   (at the end)  each step's exit status and seconds, and the result lines (stdout only)
# Every loop keeps the data on the GPU (the recipe with device_resident: true) and times epochs 2..N of training
# batches; the recipe runs with _common.NoHostSyncs (a host-device sync in an ordinary step stops that run, naming the
# operation). The lines to read: "recipe / raw = " per setting (target >= 0.95) and "bf16 + channels_last / fp32".
# $OUT gets 7 files (at most 8 come back): info.txt and <step>.txt + <step>.json for each network.
#
# Wheels: the .whl/ of benchmarks/gpu_checks.sh (its header lists them and how to fetch them again for the device's
# Python); transformers must be on the device (its image had 5.17.0) for resnet18 and vit_s.
set -u
cd "$(dirname "$0")/.."
NAME=gpu_step
BUDGET=390  # seconds for the steps after the wheels' install
source benchmarks/gpu_checks_common.sh  # OUT, PY, SITE; the wheels, the environment, step()

step info 20 bash -c "nvidia-smi -L; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; \
$PY -c 'import sys, torch, lightning, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, \
lightning.__version__, transformers.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else \"no CUDA\")'"
step convnet 100 $PY benchmarks/gpu.py --network convnet --settings fp32 bf16 compile --loops raw recipe \
    --repeats 2 --json "$OUT/convnet.json"
step resnet18 130 $PY benchmarks/gpu.py --network resnet18 --settings fp32 bf16 --loops raw recipe --repeats 2 \
    --json "$OUT/resnet18.json"
step vit_s 140 $PY benchmarks/gpu.py --network vit_s --settings fp32 bf16 --loops raw recipe --repeats 2 \
    --json "$OUT/vit_s.json"

{
    echo "gpu_step: $((SECONDS - T0)) s in all"
    printf '%s' "$SUMMARY"
    grep -h -E "recipe / raw|recipe / lightning|ms per step|/ fp32|Error|sync" \
        "$OUT"/convnet.txt "$OUT"/resnet18.txt "$OUT"/vit_s.txt 2>/dev/null | grep -v "^==" | tail -40
}  # printed only: $OUT holds the 7 files above
