#!/usr/bin/env bash
# The CUDA checks, on a machine without a GPU (called by .ci/run):
#  1. the committed PTX is what kernels/*.cu (and kernels/conformance/*.cu) compile to, and
#     ptxas accepts it for sm_90 (the pinned nvcc from PyPI, installed into
#     target/cuda-toolchain: the conformance kernels always use it unless $NVCC names another;
#     tandem's use any nvcc on CUDA_PATH or PATH first);
#  2. the `cuda` feature builds, lints and runs every GPU test against tandem's CPU stand-in
#     for the CUDA driver (target/cuda-emu: two emulated devices running the PTX in an
#     interpreter); TANDEM_REQUIRE_GPU=1 turns any skip into a failure; the README's composed
#     models train on two replicas of its GPU;
#  3. mnist-train built with `cuda` says "no device" cleanly where the driver has none;
#  4. ordinary CUDA kernels not written for tandem give NumPy's results through the stand-in,
#     and its strictness answers as the real driver's do (kernels/conformance/check.py); no
#     kernel races on shared memory (TANDEM_EMU_RACECHECK=1);
#  5. no test binary records the stand-in's folder (RPATH/RUNPATH): on a GPU machine the real
#     driver must load;
#  6. with nothing but a libcuda.so.1 (no toolkit, no CUDA_LIBRARY_PATH), mnist-train builds
#     with `cuda` and trains on the GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS

cargo xtask build-kernels --check
bash kernels/conformance/build.sh --check
cargo xtask cuda-emu

emu="$PWD/target/cuda-emu"
export CUDA_LIBRARY_PATH="$emu"
export LD_LIBRARY_PATH="$emu/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TANDEM_REQUIRE_GPU=1
cargo clippy -p tandem-kernels -p mnist-train -p tandem-integration --features cuda --all-targets \
    -- -D warnings
gpu_tests=$SECONDS
cargo test -p tandem-kernels -p mnist-train -p tandem-integration --features cuda 2>&1 |
    tee target/cuda-tests.log
if grep -q 'SKIPPED' target/cuda-tests.log; then
    echo "cuda.sh: a GPU test skipped on the stand-in" >&2; exit 1
fi
echo "cuda.sh: GPU tests on the stand-in: $(grep -o '[0-9]* passed' target/cuda-tests.log |
    awk '{n += $1} END {print n}') passed in $((SECONDS - gpu_tests)) s"

# Models composed from the layer library, both modes, on two replicas of the stand-in's GPU
# (README, "Training your own model").
cargo run -p tandem-integration --features cuda --example composed_models -- cuda:0x2 24 16

# A driver with no device (the stand-in configured with none): the trainer says so, without a
# panic or some other error that happens to mention CUDA.
cargo build -p mnist-train --features cuda
if out=$(TANDEM_EMU_DEVICES=0 target/debug/mnist-train --devices cuda:0 --steps 1 2>&1); then
    echo "cuda.sh: mnist-train --devices cuda:0 succeeded without a device" >&2; exit 1
fi
expected='Error: there is no CUDA device 0: this machine has 0'
if [ "$(head -n 1 <<<"$out")" != "$expected" ] || grep -q 'panicked' <<<"$out"; then
    echo "cuda.sh: expected '$expected', got: $out" >&2; exit 1
fi
echo "mnist-train without a device: $(head -n 1 <<<"$out")"

python="$PWD/target/conformance-python"
if ! PYTHONPATH="$python" python3 -c 'import numpy' 2>/dev/null; then
    python3 -m pip install --quiet --target "$python" numpy
fi
PYTHONPATH="$python" python3 kernels/conformance/check.py
PYTHONPATH="$python" python3 kernels/conformance/check.py --strict

# tandem's kernels and the conformance kernels under the stand-in's shared-memory race check
# (a race fails the launch with CUDA_ERROR_LAUNCH_FAILED).
TANDEM_EMU_RACECHECK=1 cargo test -q -p tandem-kernels --features cuda --test cuda
TANDEM_EMU_RACECHECK=1 cargo test -q -p tandem-integration --features cuda --test model_gpu
TANDEM_EMU_RACECHECK=1 PYTHONPATH="$python" python3 kernels/conformance/check.py >/dev/null
echo "cuda.sh: no shared-memory race in tandem's or the conformance kernels"

binaries=$(cargo test -p tandem-kernels -p tandem-integration --features cuda --no-run \
    --message-format=json 2>/dev/null |
    grep -o '"executable":"[^"]*"' | cut -d'"' -f4)
[ -n "$binaries" ] || { echo "cuda.sh: found no test binaries" >&2; exit 1; }
needs_driver=0
for binary in $binaries; do
    dynamic=$(readelf -d "$binary")
    if grep -E 'RPATH|RUNPATH' <<<"$dynamic" | grep -q 'cuda-emu'; then
        echo "cuda.sh: $binary records the stand-in's folder:" >&2
        grep -E 'RPATH|RUNPATH' <<<"$dynamic" >&2
        exit 1
    fi
    # The GPU tests must ask for the driver by its SONAME, whoever provides it.
    if grep -q 'NEEDED.*\[libcuda.so.1\]' <<<"$dynamic"; then
        needs_driver=1
    fi
done
[ "$needs_driver" = 1 ] || { echo "cuda.sh: no test binary needs libcuda.so.1" >&2; exit 1; }
# A machine with only the NVIDIA driver: no toolkit, nothing set, just libcuda.so.1 where the
# linker and the loader look (here the stand-in's copy, alone in a folder on LIBRARY_PATH, as
# the driver's is in /usr/lib). The README's GPU command must build and run there.
driver_only=$(mktemp -d)
cp target/cuda-emu/lib64/libcuda.so.1 "$driver_only/"
env -u CUDA_LIBRARY_PATH LIBRARY_PATH="$driver_only" \
    cargo build -q -p mnist-train --features cuda
readelf -d target/debug/mnist-train | grep -q 'NEEDED.*\[libcuda.so.1\]' ||
    { echo "cuda.sh: the driver-only build does not ask for libcuda.so.1" >&2; exit 1; }
# (Evaluated on the CPU: the stand-in interprets a GPU evaluation in minutes; gpu_training.rs
# runs one.)
trained=$(LD_LIBRARY_PATH="$driver_only" target/debug/mnist-train --devices cuda:0 --steps 3 \
    --log-format plain --log-every 1 --eval-on cpu)
grep -q '^== summary ==' <<<"$trained" ||
    { echo "cuda.sh: the driver-only build does not train on cuda:0:" >&2; echo "$trained" >&2; exit 1; }
rm -rf "$driver_only"
echo "cuda.sh: the GPU binary builds and trains with only the driver's libcuda.so.1"
echo "cuda.sh: ok in $((SECONDS - start)) s"
