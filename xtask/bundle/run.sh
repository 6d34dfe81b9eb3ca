#!/usr/bin/env bash
# Runs on a GPU machine with no Rust toolchain (PyTorch with CUDA for the anchor), from the
# bundle that `cargo xtask gpu-bundle` builds. In order, each step cut off at its own limit:
#   1. the conformance suite (kernels/conformance) on NVIDIA's driver: the ordinary kernels must
#      give NumPy's results here as on the CPU stand-in, the strict checks the stand-in's errors;
#   2. the CUDA test executables (every kernel against its CPU twin; the model and sync strategy);
#   3. on cuda:0, cuda:0x2, cuda:0x4 and, where the machine has several GPUs, on all of them:
#      `mnist-train --sync` and `--async` for EPOCHS (test accuracy, examples/sec), then
#      `mnist-train compare` for the time to 98% test accuracy;
#      then --precision f32, bf16 and f16 on cuda:0 at batch 100 and 1,000 (issue 29);
#   4. PyTorch's same model on cuda:0 (anchors/torch_gpu_variants.py): eager, CUDA graph and
#      torch.compile, each timed the same way, and the graph variant with a capturable
#      moving-average update;
#   5. with PROFILE=1, each kernel's duration in one sync step on cuda:0 (ncu);
#   6. one table, every run's examples/sec also as a multiple of PyTorch eager's.
# It exits 0 only if every check of tandem passed and every tandem run reached MIN_ACCURACY (a
# PyTorch variant that fails is reported, and its row left empty: the anchor is not under test).
# Logs go to logs/.
#   EPOCHS=30 PROFILE=1 ./run.sh
set -uo pipefail
cd "$(dirname "$0")"
# Shorter than mnist-train's default of 100 epochs, to fit the device time; on CPU workers 30
# epochs reach 98.1-98.4% test accuracy in both modes.
EPOCHS=${EPOCHS:-30}
# Seconds for one training run or `compare` (both modes), and for one PyTorch variant.
LIMIT=${LIMIT:-90}
# The least final test accuracy (averaged parameters) a tandem run must reach.
MIN_ACCURACY=${MIN_ACCURACY:-0.975}
# Every run at the default flags: asynchronous training on 4 or more replicas trains there too
# (the scaled rule and the warm-up on one worker; README, "Many workers"). ASYNC_FLAGS adds
# flags to the async runs, e.g. ASYNC_FLAGS="--async-rule plain --async-warmup 0".
read -r -a async_flags <<<"${ASYNC_FLAGS:-}"
export TANDEM_MNIST_DIR=$PWD/data/mnist
# A GPU test that finds no device fails here instead of skipping.
export TANDEM_REQUIRE_GPU=1
# The conformance checker and the PyTorch anchor need NumPy. A GPU machine without it (and
# without a package index) can be given wheels in wheels/ (`pip download numpy
# --only-binary=:all: --python-version 3.X -d wheels`); they are installed into python/.
if ! python3 -c 'import numpy' 2>/dev/null && compgen -G 'wheels/numpy-*.whl' >/dev/null; then
    python3 -m pip install --quiet --no-index --find-links wheels --target python numpy ||
        echo "FAILED: installing NumPy from wheels/"
    export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
fi
mkdir -p logs
failed=0
rows=()

nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 |
    tee logs/gpus.txt

echo "== Conformance: ordinary CUDA kernels and the strict checks on the real driver"
for flags in "" --strict; do
    log="logs/conformance${flags:+-strict}.log"
    if ! timeout 60 python3 conformance/check.py $flags >"$log" 2>&1; then
        echo "FAILED: conformance/check.py $flags (see $log)"; failed=1
    fi
    tail -n 5 "$log"
done

echo "== CUDA tests"
for t in tests/*; do
    log="logs/test-$(basename "$t").log"
    if ! timeout 120 "$t" >"$log" 2>&1; then
        echo "FAILED: $t (see $log)"; failed=1
    fi
    grep -E '^test result|panicked|FAILED' "$log"
done

# One cell of compare.md: in the row whose label holds LABEL, column 1 (sync) or 2 (async).
cell() {
    awk -F'|' -v label="$1" -v col="$(($2 + 2))" '
        index($2, label) { gsub(/^ +| +$/, "", $col); print $col; exit }' "$3"
}

# A value of mnist-train's summary: the first word after LABEL on its line.
summary() {
    awk -v label="$1:" '$0 ~ "^" label { sub("^" label " *", ""); print $1; exit }' "$2"
}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
device_sets=(cuda:0 cuda:0x2 cuda:0x4)
if [ "${gpus:-0}" -gt 1 ]; then device_sets+=("cuda:$(seq -s, 0 $((gpus - 1)))"); fi
for devices in "${device_sets[@]}"; do
    name=${devices//[:,]/-}
    # The run a user starts: its accuracy and examples/sec. Then `compare` for the time to 98%
    # (it stops every epoch to evaluate, and reads the loss back more often than a plain run).
    for mode in sync async; do
        log="logs/train-$mode-$name.log"
        echo "== mnist-train --$mode --devices $devices --epochs $EPOCHS"
        flags=()
        [ "$mode" = async ] && flags=("${async_flags[@]}")
        if ! timeout "$LIMIT" bin/mnist-train "--$mode" --devices "$devices" --epochs "$EPOCHS" \
            "${flags[@]}" >"$log" 2>&1; then
            echo "FAILED: see $log"; failed=1
            tail -n 5 "$log"
        fi
        grep -E '^(examples/sec|test accuracy|training time):' "$log"
        accuracy=$(summary 'test accuracy' "$log")
        if ! awk -v a="${accuracy:-0}" -v min="$MIN_ACCURACY" 'BEGIN { exit !(a >= min) }'; then
            echo "FAILED: $mode on $devices: test accuracy ${accuracy:-missing} below $MIN_ACCURACY"
            failed=1
        fi
    done
    # Each mode's time to 98% from a compare at its flags.
    for column in 1 2; do
        mode=$([ "$column" = 1 ] && echo sync || echo async)
        flags=()
        [ "$mode" = async ] && flags=("${async_flags[@]}")
        report="logs/report-$name-$mode/compare.md"
        log="logs/compare-$name-$mode.log"
        if [ ! -e "$log" ]; then
            echo "== mnist-train compare --devices $devices --epochs $EPOCHS ${flags[*]}"
            if ! timeout "$LIMIT" bin/mnist-train compare --devices "$devices" --epochs "$EPOCHS" \
                --evals-per-epoch 1 "${flags[@]}" --report "$(dirname "$report")" >"$log" 2>&1; then
                echo "FAILED: see $log"; failed=1
                tail -n 5 "$log"
            fi
            grep -E '^\| (time to|staleness)' "$log"
        fi
        t98=$(cell 'time to 98%' "$column" "$report" 2>/dev/null | sed 's/ (.*//')
        log="logs/train-$mode-$name.log"
        rows+=("tandem $mode $devices${flags[*]:+ ${flags[*]}}|$(summary 'test accuracy' "$log")|$(summary 'examples/sec' "$log")|$t98")
    done
done

# Mixed precision (issue 29): f32, bf16 and f16 on one replica at batch 100 and 1,000.
for batch in 100 1000; do
    for precision in f32 bf16 f16; do
        log="logs/train-sync-cuda-0-$precision-$batch.log"
        [ "$precision$batch" = f32100 ] && continue # the cuda:0 sync run above
        echo "== mnist-train --sync --devices cuda:0 --precision $precision --batch-size $batch"
        if ! timeout "$LIMIT" bin/mnist-train --sync --devices cuda:0 --precision "$precision" \
            --batch-size "$batch" --epochs "$EPOCHS" >"$log" 2>&1; then
            echo "FAILED: see $log"; failed=1
            tail -n 5 "$log"
        fi
        grep -E '^(examples/sec|test accuracy|precision):' "$log"
        rows+=("tandem sync cuda:0 $precision batch $batch|$(summary 'test accuracy' "$log")|$(summary 'examples/sec' "$log")|")
    done
done

echo "== PyTorch on cuda:0: eager, CUDA graph, torch.compile"
# The anchor's graph variant updates the moving average with torch._foreach_lerp_ and a tensor
# weight, which (by its error on PyTorch 2.11: the capture is invalidated) reads the weight back
# to the host. The copy below does the same update with one lerp_ per tensor instead, which
# captures, and runs as a fourth variant.
sed 's/torch\._foreach_lerp_(E, \[t\.detach() for t in P\], 1\.0 - d)/[e.lerp_(t.detach(), 1.0 - d) for e, t in zip(E, P)]/' \
    anchors/torch_gpu_variants.py >anchors/torch_gpu_variants_lerp.py
cmp -s anchors/torch_gpu_variants.py anchors/torch_gpu_variants_lerp.py &&
    echo "note: the anchor's moving-average line changed; the lerp_ copy is the anchor itself"
for variant in eager graph graph-lerp compile; do
    log="logs/torch-$variant.log"
    script=anchors/torch_gpu_variants.py
    [ "$variant" = graph-lerp ] && script=anchors/torch_gpu_variants_lerp.py
    # torch.compile spends most of its time compiling and autotuning (over 100 s on an H200): it
    # gets three times the limit.
    limit=$([ "$variant" = compile ] && echo $((LIMIT * 3)) || echo "$LIMIT")
    timeout "$limit" python3 "$script" --epochs "$EPOCHS" --variants "${variant%-lerp}" \
        >"$log" 2>&1
    row=$(python3 - "$log" <<'EOF'
import json, sys
try:
    r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
    t98 = r["seconds_to_98"]
    print("%.4f|%.0f|%s" % (r["test_acc_ema"], r["examples_per_sec_median"],
                            "not reached" if t98 is None else "%.1f s" % t98))
except Exception:
    sys.exit(1)
EOF
    ) || { echo "PyTorch $variant failed (see $log)"; tail -n 3 "$log"; row="||"; }
    rows+=("pytorch $variant cuda:0|$row")
    [ "$variant" = eager ] && eager_eps=$(cut -d'|' -f2 <<<"$row")
done

if [ "${PROFILE:-0}" = 1 ]; then
    # Where a step's GPU time goes, kernel by kernel. ncu runs each kernel alone (graph nodes
    # too), so the durations are each kernel's own, without the overlap of a graph launch. At
    # the base clock without cache flushes: with --clock-control none the GPU idles at a low
    # clock between the replayed kernels (an H200 read 2-3 times longer durations so).
    echo "== ncu: the kernels of one sync step on cuda:0"
    if timeout 120 ncu --clock-control base --cache-control none --csv --print-units base \
        --metrics gpu__time_duration.sum,launch__grid_size \
        bin/mnist-train --sync --devices cuda:0 --steps 8 --log-every 0 >logs/ncu.csv 2>logs/ncu.err; then
        python3 - logs/ncu.csv <<'EOF' || echo "FAILED: reading logs/ncu.csv"
import csv, sys
lines = open(sys.argv[1]).read().splitlines()
start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
if start is None:
    sys.exit("no ncu table in " + sys.argv[1])
kernels = {}
for row in csv.DictReader(lines[start:]):
    k = kernels.setdefault(row["ID"], {"name": row["Kernel Name"]})
    k[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
names = [k["name"] for k in kernels.values()]
# The step begins with the batch's gather, fused into the first product (gather_matmul).
last = max(i for i, n in enumerate(names) if n.startswith("gather"))
first = last
while first > 0 and names[first - 1] == "sgd_ema_update":
    first -= 1
step = list(kernels.values())[first:]
for k in step:
    print("%-24s %6d blocks %7.1f us" % (k["name"], k["launch__grid_size"], k["gpu__time_duration.sum"] / 1e3))
print("%-24s %13s %7.1f us" % ("one step", "", sum(k["gpu__time_duration.sum"] for k in step) / 1e3))
EOF
    else
        echo "FAILED: ncu (see logs/ncu.err)"; failed=1
    fi
fi

echo
echo "== $EPOCHS epochs, batch 100 per replica unless the row says; examples/sec is the median of PyTorch's epochs"
{
printf '%-30s %-14s %-14s %-14s %s\n' run "test accuracy" examples/sec "time to 98%" "x eager"
for row in "${rows[@]}"; do
    IFS='|' read -r name acc eps t98 <<<"$row"
    ratio=$(awk -v a="${eps:-0}" -v b="${eager_eps:-0}" \
        'BEGIN { if (a > 0 && b > 0) printf "%.1f", a / b; else print "?" }')
    printf '%-30s %-14s %-14s %-14s %s\n' "$name" "${acc:-?}" "${eps:-?}" "${t98:-?}" "$ratio"
done
} | tee logs/table.txt
exit "$failed"
