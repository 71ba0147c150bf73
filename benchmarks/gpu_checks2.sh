#!/usr/bin/env bash
# The SECOND GPU device run of issue 33, as ONE prepared script: where the recipe's GPU step time goes (bare
# Lightning beside the raw loop and the recipe; a host profile by hook), the CUDA tests of the GPU fixes, the
# sync-free batch augmentation, and the image recipe's ResNet with its batch augmentation. Under 5 minutes of wall
# time (every step's timeout is cut to what is left of 280 s after the wheels are installed).
#
#   device run:  command "bash benchmarks/gpu_checks2.sh", carry [".whl"], timeout_s 330
#   here:        OUT=/tmp/gpu_checks2 PYTHON=.venv/bin/python SITE=/tmp/gpu_checks2_site bash benchmarks/gpu_checks2.sh
#                (no CUDA: the benchmarks say they are skipped, the CUDA tests are skipped; the cp312 wheels do
#                not install into Python 3.11)
#
# Steps, each under its own `timeout`, each tee'd to $OUT/<step>.txt; a step that fails does not stop the others:
#   gpu           gpu.py --settings bf16 fp32 --loops raw lightning recipe --repeats 3 -> gpu.json   (~90 s)
#                 (recipe / raw, recipe / lightning = loopwise's cost, lightning / raw = Lightning's, ms per step)
#   profile       gpu.py --profile bf16: host ms per step by Lightning hook and the top 15 by self CPU time of
#                 30 steps, for the lightning and the recipe loop (the whole report is in profile.txt)  (~40 s)
#   tests         tests/datamodules/test_batch_augmentation_cuda.py (and the other CUDA-only tests, found by their
#                 skipif), tests/run/test_cli.py -k "gpu-bf16 or gpu-fp16"                            (~35 s)
#   augmentation  augmentation.py --device cuda --quick -> augmentation.json                          (~15 s)
#   gpu_images    gpu_images.py --models resnet --settings bf16 bf16-aug: the ResNet in bf16 without and with
#                 the image recipe's batch augmentation, each with its host-sync check -> gpu_images.json (~80 s)
#   (at the end)  each step's exit status and seconds, and the result lines (stdout only)
# $OUT gets these 8 files (at most 8 come back): gpu.txt gpu.json profile.txt tests.txt augmentation.txt
# augmentation.json gpu_images.txt gpu_images.json.
#
# Wheels: the .whl/ of benchmarks/gpu_checks.sh (its header lists them and how to fetch them again).
set -u
cd "$(dirname "$0")/.."
NAME=gpu_checks2
BUDGET=280  # seconds for the steps after the wheels' install
source benchmarks/gpu_checks_common.sh  # OUT, PY, SITE; the wheels, the environment, step()

cuda_tests() {
    # the CUDA-only tests (found by their skipif, as gpu_checks.sh does; the augmentation's whole module by its name)
    # and every recipe with the GPU trainer fragments (fp16 + clipping with fused AdamW, the LM's loss under
    # deterministic)
    local files names
    files=$( (echo tests/datamodules/test_batch_augmentation_cuda.py
        grep -rl --include='*.py' 'skipif(not torch.cuda.is_available()' tests) | sort -u)
    names=$(grep -h -A4 --include='*.py' -r 'skipif(not torch.cuda.is_available()' tests \
        | grep -o 'def test_[A-Za-z0-9_]*' | sed 's/^def //' | sort -u | paste -sd' ' | sed 's/ / or /g')
    echo "CUDA-only tests: ${names:-none} in ${files//$'\n'/ }"
    $PY -m pytest -p no:xdist -o addopts="" -p no:cacheprovider -q -rs --durations=5 \
        $files tests/run/test_cli.py -k "${names:+$names or }test_batch_augmentation_cuda or gpu-bf16 or gpu-fp16"
    # with torchvision there, transformers' default image processors are the torchvision ("fast") ones: does the data
    # module accept them, and how far are its Pillow pixels from theirs (the assertion messages carry the largest
    # difference per processor)
    echo "== image processors as transformers loads them there (torchvision backend) vs the data module's pixels"
    $PY -m pytest -p no:xdist -o addopts="" -p no:cacheprovider -q --tb=line \
        tests/datamodules/test_image_processor.py -k "equal_the_processors_pixel_values" 2>&1 | tail -16
}

export -f cuda_tests
export PY
step gpu 130 $PY benchmarks/gpu.py --settings bf16 fp32 --loops raw lightning recipe --repeats 3 \
    --json "$OUT/gpu.json"
step profile 75 $PY benchmarks/gpu.py --profile bf16 --profile-out /tmp/gpu_profile.txt
step tests 80 bash -c cuda_tests
step augmentation 30 $PY benchmarks/augmentation.py --device cuda --quick --json "$OUT/augmentation.json"
LEFT=$((DEADLINE - SECONDS - 10))  # no repetition starts that would pass the step's timeout
step gpu_images 100 $PY benchmarks/gpu_images.py --models resnet --settings bf16 bf16-aug --repeats 3 \
    --max-seconds $((LEFT < 90 ? LEFT : 90)) --json "$OUT/gpu_images.json"

{
    echo "gpu_checks2: $((SECONDS - T0)) s in all"
    printf '%s' "$SUMMARY"
    grep -h -E "recipe / raw|recipe / lightning|ms per step|bf16 \+ channels_last|: [0-9]+ steps, host | / per-sample = |^[0-9]+ (passed|failed)|^(FAILED|ERROR) |Error|images/s \(median|x \(per repetition|loader alone|host syncs" \
        "$OUT"/gpu.txt "$OUT"/profile.txt "$OUT"/tests.txt "$OUT"/augmentation.txt "$OUT"/gpu_images.txt \
        2>/dev/null | grep -v "^==" | tail -40
}  # printed only: $OUT holds the 8 files above, all that can come back
