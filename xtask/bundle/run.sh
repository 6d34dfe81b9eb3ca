#!/usr/bin/env bash
# Runs on a GPU machine with no Rust toolchain (PyTorch with CUDA for the anchor), from the
# bundle that `cargo xtask gpu-bundle` builds: the CUDA kernel tests, then mnist-train --sync and
# --async on 1, 2 and 4 replicas of cuda:0, then PyTorch's same model on the same GPU, and one
# table. First, the conformance suite (kernels/conformance) against NVIDIA's driver: the ordinary
# kernels must give NumPy's results here as on the CPU stand-in, and the strict checks must get
# the error codes the stand-in gives. Each run is cut off at LIMIT seconds so the whole stays within about 5 minutes.
#   EPOCHS=30 LIMIT=30 ./run.sh
set -uo pipefail
cd "$(dirname "$0")"
# Shorter than mnist-train's default of 100 epochs, to fit the device time; on CPU workers 30
# epochs reach 98.1-98.4% test accuracy in both modes.
EPOCHS=${EPOCHS:-30}
LIMIT=${LIMIT:-30}
# The least test accuracy (averaged parameters) a training run must reach.
MIN_ACCURACY=${MIN_ACCURACY:-0.975}
export TANDEM_MNIST_DIR=$PWD/data/mnist
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

# On the last line of FILE that mentions KEY: the number right after KEY, else the one just
# before it, else the first one after it; commas dropped. mnist-train's summary format is not
# pinned down, so this parses loosely.
pick() {
    local line
    line=$(grep -i -- "$1" "$2" | tail -n 1)
    { sed -nE "s#.*$1[^0-9a-z]*([0-9][0-9,]*(\.[0-9]+)?).*#\1#Ip" <<<"$line"
      sed -nE "s#(^|.*[^0-9.,])([0-9][0-9,]*(\.[0-9]+)?)[^0-9]*$1.*#\2#Ip" <<<"$line"
      sed -nE "s#.*$1[^0-9]*([0-9][0-9,]*(\.[0-9]+)?).*#\1#Ip" <<<"$line"
    } | head -n 1 | tr -d ,
}

echo "== Conformance: ordinary CUDA kernels and the strict checks on the real driver"
for flags in "" --strict; do
    log="logs/conformance${flags:+-strict}.log"
    if ! timeout "$LIMIT" python3 conformance/check.py $flags >"$log" 2>&1; then
        echo "FAILED: conformance/check.py $flags (see $log)"; failed=1
    fi
    cat "$log"
done

echo "== CUDA kernel tests"
for t in tests/*; do
    log="logs/test-$(basename "$t").log"
    if ! timeout "$LIMIT" "$t" >"$log" 2>&1; then
        echo "FAILED: $t (see $log)"; failed=1
    fi
    if grep -q 'SKIPPED' "$log"; then
        echo "FAILED: $t skipped on a GPU machine: no device seen (see $log)"; failed=1
    fi
    grep -E '^test result' "$log"
done

for mode in sync async; do
    for devices in cuda:0 cuda:0x2 cuda:0x4; do
        log="logs/train-$mode-${devices/:/-}.log"
        echo "== mnist-train --$mode --devices $devices"
        if ! timeout "$LIMIT" bin/mnist-train "--$mode" --devices "$devices" --epochs "$EPOCHS" \
            --data-dir data/mnist >"$log" 2>&1; then
            echo "FAILED: see $log"; failed=1
            head -n 3 "$log"
        else
            tail -n 3 "$log"
            # A GPU run that trains but learns nothing is a failure too: at 30 epochs the CPU
            # workers reach 98.1-98.4%.
            accuracy=$(pick 'test accuracy' "$log")
            if ! awk -v a="${accuracy:-0}" -v min="$MIN_ACCURACY" 'BEGIN { exit !(a >= min) }'; then
                echo "FAILED: test accuracy ${accuracy:-missing} below $MIN_ACCURACY (see $log)"
                failed=1
            fi
        fi
        rows+=("tandem --$mode $devices|$(pick 'test accuracy' "$log")|$(pick 'examples/sec' "$log")")
    done
done

echo "== PyTorch, one process on cuda:0"
if timeout "$((LIMIT * 2))" python3 anchors/torch_gpu.py --epochs "$EPOCHS" >logs/torch.log 2>&1; then
    torch=$(python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print("%.4f|%.0f" % (r["acc_avg"], r["examples_per_sec"]))' logs/torch.log)
else
    echo "FAILED: see logs/torch.log"; failed=1; torch="|"
fi
rows+=("pytorch cuda:0|$torch")
torch_eps=${torch#*|}

echo
echo "== $EPOCHS epochs, batch 100 per replica"
printf '%-24s %-14s %-14s %s\n' run "test accuracy" examples/sec "x pytorch"
for row in "${rows[@]}"; do
    IFS='|' read -r name acc eps <<<"$row"
    ratio=$(awk -v a="${eps:-0}" -v b="${torch_eps:-0}" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "?" }')
    printf '%-24s %-14s %-14s %s\n' "$name" "${acc:-?}" "${eps:-?}" "$ratio"
done
exit "$failed"
