#!/usr/bin/env bash
# tandem's crates used from outside its workspace (called by .ci/run): a fresh directory with
# .ci/outside/Cargo.toml (paths pointed at this checkout) and the composed_models example as
# its main, built and run with a plain `cargo run`, as README's "Training your own model" says.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
crate=$(mktemp -d)
trap 'rm -rf "$crate"' EXIT
sed "s|@TANDEM@|$root|g" .ci/outside/Cargo.toml > "$crate/Cargo.toml"
mkdir "$crate/src"
cp crates/tandem-integration/examples/composed_models/*.rs "$crate/src/"
( cd "$crate" && TANDEM_MNIST_DIR="$root/data/mnist" cargo run -q -- cpu:2 300 100 )
echo "outside.sh: the composed models trained from a crate outside the workspace"
