#!/usr/bin/env bash
# Compiles kernels/conformance/*.cu to the committed *.ptx beside them, with the nvcc and flags
# tandem's own kernels use (xtask/src/kernels.rs), and validates each PTX with ptxas for sm_90
# (the compilation the driver's JIT does on a Hopper GPU).
#
#   kernels/conformance/build.sh           regenerate the .ptx files
#   kernels/conformance/build.sh --check   fail (exit 1) if a committed .ptx differs from what
#                                          the pinned nvcc writes now, or has no .cu
#
# nvcc: $NVCC if set, else the pinned toolchain in target/cuda-toolchain/ (nvcc 13.0.88 from
# PyPI wheels), installed there with pip exactly as xtask/src/toolchain.rs does if absent (the
# same marker file, so `cargo xtask build-kernels --pinned` and this script share the install).
# Another nvcc release may write different (equally valid) PTX and so fail --check.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
check=0
case "${1:-}" in
    --check) check=1 ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

pinned_release="V13.0.88"
wheels=(
    nvidia-cuda-nvcc==13.0.88
    nvidia-cuda-crt==13.0.88
    nvidia-nvvm==13.0.88
    nvidia-cuda-runtime==13.0.96
    nvidia-cuda-cccl==13.0.85
)

if [[ -n "${NVCC:-}" ]]; then
    nvcc="$NVCC"
else
    toolchain="$root/target/cuda-toolchain"
    nvcc="$toolchain/nvidia/cu13/bin/nvcc"
    wanted="$(printf '%s\n' "${wheels[@]}")"
    wanted="${wanted%$'\n'}"
    if [[ "$(cat "$toolchain/.installed" 2>/dev/null || true)" != "$wanted" ]]; then
        echo "installing the pinned CUDA toolchain into $toolchain" >&2
        rm -rf "$toolchain"
        python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
            --no-deps --target "$toolchain" "${wheels[@]}"
        printf '%s' "$wanted" > "$toolchain/.installed"
    fi
fi
[[ -x "$nvcc" ]] || { echo "no nvcc at $nvcc" >&2; exit 1; }
ptxas="$(dirname "$nvcc")/ptxas"
release="$("$nvcc" --version | grep -o 'V[0-9][0-9.]*' | head -n1)"
if [[ "$release" != "$pinned_release" ]]; then
    echo "warning: the committed PTX comes from nvcc $pinned_release; $nvcc is $release" >&2
fi
cccl="$(dirname "$nvcc")/../include/cccl"
include=()
[[ -d "$cccl" ]] && include=(-I "$cccl")

scratch="$root/target/conformance-kernels"
mkdir -p "$scratch"
stale=()
shopt -s nullglob
sources=("$here"/*.cu)
[[ ${#sources[@]} -gt 0 ]] || { echo "no .cu files in $here" >&2; exit 1; }
for source in "${sources[@]}"; do
    name="$(basename "$source" .cu)"
    if [[ $check == 1 ]]; then out="$scratch/$name.ptx"; else out="$here/$name.ptx"; fi
    # The xtask's flags: no -lineinfo / -G (they embed paths), no fast math, warnings are errors.
    # compute_75 unless the source asks for another (`// nvcc-arch: compute_90` on its first
    # line: instructions older targets do not have, such as bf16 arithmetic).
    arch="$(sed -n '1s|^// nvcc-arch: \(compute_[0-9]*\)$|\1|p' "$source")"
    "$nvcc" -ptx -arch="${arch:-compute_75}" -std=c++17 -Werror all-warnings "${include[@]}" -o "$out" "$source"
    "$ptxas" -arch=sm_90 --warning-as-error -o "$scratch/$name.cubin" "$out"
    if [[ $check == 1 ]] && ! cmp -s "$out" "$here/$name.ptx"; then
        stale+=("$name.ptx")
    fi
done
for ptx in "$here"/*.ptx; do
    name="$(basename "$ptx" .ptx)"
    if [[ ! -f "$here/$name.cu" ]]; then
        if [[ $check == 1 ]]; then stale+=("$name.ptx (no $name.cu)"); else rm -f "$ptx"; fi
    fi
done
if [[ ${#stale[@]} -gt 0 ]]; then
    echo "stale PTX in kernels/conformance: ${stale[*]}; run kernels/conformance/build.sh and commit" >&2
    exit 1
fi
echo "$([[ $check == 1 ]] && echo checked || echo built) ${#sources[@]} conformance kernel files (compute_75 PTX unless a file names another, ptxas-validated for sm_90, nvcc $release)" >&2
