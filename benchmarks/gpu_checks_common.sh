# Shared by benchmarks/gpu_checks.sh, gpu_checks2.sh and gpu_step.sh (sourced from the repository root, never run
# alone): installs the wheels carried in .whl/ into $SITE, exports what the steps need, and defines `step`, which runs
# one step under a timeout cut to what is left of the script's time. The sourcing script sets NAME (its name in
# messages and its default output folder) and BUDGET (seconds for all the steps after the install); the environment
# may set OUT (default /tmp/$NAME), PYTHON (default python3) and SITE (where the wheels go, default /tmp/site).
OUT=${OUT:-/tmp/$NAME}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
SUMMARY=""
T0=$SECONDS
if ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
        || echo "$NAME: installing the wheels of .whl/ FAILED (the steps run with what is there)"
else
    echo "$NAME: no .whl/ here (name it in carry): running with the packages already installed"
fi
echo "$NAME: wheels installed in $((SECONDS - T0)) s"
DEADLINE=$((SECONDS + BUDGET))
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
unset MLFLOW_TRACKING_URI  # the recipes' default: the embedded SQLite store in each run's folder

step() {  # step NAME MAX_SECONDS COMMAND...: run under timeout, output tee'd to $OUT/NAME.txt
    local name=$1 cap=$2 left t0 rc
    shift 2
    left=$((DEADLINE - SECONDS))
    ((left < cap)) && cap=$left
    if ((cap < 15)); then
        echo "== $name: not run, the script's time is spent" | tee "$OUT/$name.txt"
        SUMMARY+="$name: not run (no time left)"$'\n'
        return
    fi
    echo "== $name (timeout ${cap} s): $*" | tee "$OUT/$name.txt"
    t0=$SECONDS
    timeout -k 10 "$cap" "$@" 2>&1 | tee -a "$OUT/$name.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && rc="124 (timed out)"
    echo "== $name: exit $rc in $((SECONDS - t0)) s" | tee -a "$OUT/$name.txt"
    SUMMARY+="$name: exit $rc in $((SECONDS - t0)) s"$'\n'
}
