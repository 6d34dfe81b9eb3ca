#!/usr/bin/env bash
# The CUDA checks that need no GPU (called by .ci/run):
#  1. the committed PTX is what kernels/*.cu compile to, and ptxas accepts it for sm_90
#     (installs the pinned nvcc from PyPI into target/cuda-toolchain when none is installed);
#  2. the `cuda` feature builds, lints and runs its tests against a stub libcuda, where every
#     GPU test reports "SKIPPED: ...: no CUDA device" on stderr;
#  3. no test binary records the stub's folder (RPATH/RUNPATH): on a GPU machine the real
#     driver must load.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

cargo xtask build-kernels --check
cargo xtask cuda-stub

stub="$PWD/target/cuda-stub"
export CUDA_LIBRARY_PATH="$stub"
export LD_LIBRARY_PATH="$stub/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cargo clippy -p tandem-kernels -p tandem-pool -p mnist-train --features cuda --all-targets -- -D warnings
cargo test -p tandem-kernels -p tandem-pool --features cuda
# The GPU-enabled trainer links and, without a device, says so instead of crashing.
cargo build -p mnist-train --features cuda
if out=$(target/debug/mnist-train --devices cuda:0 --steps 1 2>&1); then
    echo "cuda.sh: mnist-train --devices cuda:0 succeeded without a GPU" >&2; exit 1
fi
# The stub answers every call with CUDA_ERROR_NO_DEVICE: zero GPUs, said as such (not a panic,
# not some other error that happens to mention CUDA).
expected='Error: there is no CUDA device 0: this machine has 0'
if [ "$(head -n 1 <<<"$out")" != "$expected" ] || grep -q 'panicked' <<<"$out"; then
    echo "cuda.sh: expected '$expected', got: $out" >&2; exit 1
fi
echo "mnist-train without a GPU: $(head -n 1 <<<"$out")"

binaries=$(cargo test -p tandem-kernels --features cuda --no-run --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
[ -n "$binaries" ] || { echo "cuda.sh: found no test binaries" >&2; exit 1; }
needs_driver=0
for binary in $binaries; do
    dynamic=$(readelf -d "$binary")
    if grep -E 'RPATH|RUNPATH' <<<"$dynamic" | grep -q 'cuda-stub'; then
        echo "cuda.sh: $binary records the stub libcuda's folder:" >&2
        grep -E 'RPATH|RUNPATH' <<<"$dynamic" >&2
        exit 1
    fi
    # The GPU tests must ask for the driver by its SONAME, whoever provides it.
    if grep -q 'NEEDED.*\[libcuda.so.1\]' <<<"$dynamic"; then
        needs_driver=1
    fi
done
[ "$needs_driver" = 1 ] || { echo "cuda.sh: no test binary needs libcuda.so.1" >&2; exit 1; }
echo "cuda.sh: ok in $((SECONDS - start)) s"
