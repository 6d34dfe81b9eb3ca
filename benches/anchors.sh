#!/usr/bin/env bash
# Side-by-side throughput against the TensorFlow anchor (../shared/anchors/tf_multitower.py):
# alternating runs of tandem and TensorFlow, sync and async, 2 workers x 1 thread each, the
# same 3000 steps of batch 100 per worker; prints the medians and the ratios.
#
#   bash benches/anchors.sh [ROUNDS]      (default 3; needs TensorFlow in $TF_PYTHON)
#
# Set up TensorFlow once: python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu numpy
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
anchors=${ANCHORS:-../shared/anchors}
tf_python=${TF_PYTHON:-/tmp/tfenv/bin/python}
[ -x "$tf_python" ] || { echo "no TensorFlow python at $tf_python (set TF_PYTHON)" >&2; exit 1; }
cargo build --release -q -p mnist-train
export MNIST_DIR=${MNIST_DIR:-$PWD/data/mnist}

tandem() { # mode -> examples/sec
    ./target/release/mnist-train "--$1" --devices cpu:2 --steps "$2" --log-every 0 |
        awk '/^examples\/sec:/ {print $2}'
}
tensorflow() { # mode -> examples/sec
    "$tf_python" "$anchors/tf_multitower.py" --mode "$1" --towers 2 --intra 1 --inter 2 \
        --steps 3000 --eval-at 3000 2>/dev/null | tail -n 1 |
        python3 -c 'import json,sys; print(round(json.load(sys.stdin)["examples_per_sec"]))'
}
median() { sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

declare -A runs
for round in $(seq "$rounds"); do
    for mode in sync async; do
        # sync: 3000 steps of 2 x 100; async: 6000 updates of 100 (the same 600,000 examples).
        steps=$([ "$mode" = sync ] && echo 3000 || echo 6000)
        t=$(tandem "$mode" "$steps"); f=$(tensorflow "$mode")
        echo "round $round $mode: tandem $t, tensorflow $f examples/sec"
        runs[tandem_$mode]+="$t "; runs[tf_$mode]+="$f "
    done
done
echo
printf '%-6s %12s %12s %7s\n' mode tandem tensorflow ratio
for mode in sync async; do
    t=$(echo ${runs[tandem_$mode]} | tr ' ' '\n' | median)
    f=$(echo ${runs[tf_$mode]} | tr ' ' '\n' | median)
    printf '%-6s %12s %12s %7.2f\n' "$mode" "$t" "$f" "$(echo "$t / $f" | bc -l)"
done
