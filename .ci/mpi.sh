#!/usr/bin/env bash
# Training across processes (the `mpi` feature) under `mpirun -n 2` on this machine: installs
# the system's Open MPI and libclang if they are missing (README's install line), lints the
# `mpi` feature's code, then runs README's MPI test command.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libopenmpi-dev openmpi-bin libclang-dev)
if ! dpkg -s "${packages[@]}" >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${packages[@]}"
fi

# Open MPI refuses root unless told twice; CI's containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cargo clippy -p tandem-mpi -p tandem-train -p mnist-train --all-targets --features mnist-train/mpi -- -D warnings
cargo test -p mnist-train --features mpi --test mpi
