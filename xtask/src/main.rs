//! Project tasks, run as `cargo xtask <command>` (an alias in `.cargo/config.toml`).
//!
//! * `build-kernels [--check] [--pinned]`: compiles every `kernels/*.cu` to PTX in
//!   `crates/tandem-kernels/ptx/`, or with `--check` fails when that committed PTX is stale.
//! * `cuda-emu`: builds tandem's CPU stand-in for the CUDA driver (`libcuda.so.1`, running the
//!   PTX in an interpreter) into `target/cuda-emu/lib64`, for machines without a GPU.
//! * `gpu-bundle`: builds the binaries and GPU tests into `gpu-bundle/` with a `run.sh` for a
//!   GPU machine that has no Rust toolchain.
//! * `bench-train [--rounds N] [--epochs N]`: whole training runs, sync and async at one and two
//!   CPU workers, alternated, with the median examples/sec of each and its fraction of the GEMM
//!   floor measured just before and after each run.
//! * `mutants [ARGS]`: mutation testing (cargo-mutants) of the code that decides results.

#[cfg(test)]
mod architecture;
mod bench;
mod bundle;
mod emu;
mod kernels;
mod mutants;
mod toolchain;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "tandem's project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Compile kernels/*.cu to PTX (crates/tandem-kernels/ptx/) and validate it with ptxas.
    BuildKernels {
        /// Compile into a scratch folder and fail if the committed PTX differs from it.
        #[arg(long)]
        check: bool,
        /// Use the pinned toolchain from PyPI even when another nvcc is installed.
        #[arg(long)]
        pinned: bool,
    },
    /// Build tandem's CPU stand-in for the CUDA driver (crates/tandem-cuda-emu) as
    /// target/cuda-emu/lib64/libcuda.so.1: `--features cuda` binaries then link and run their
    /// kernels without a GPU (see README, "Testing the CUDA backend without a GPU").
    CudaEmu,
    /// Build release binaries and the CUDA test executables into gpu-bundle/ with a run.sh.
    GpuBundle,
    /// Train sync and async at 1 and 2 CPU workers (release build), alternating the runs, and
    /// print the median examples/sec of each.
    BenchTrain {
        /// Rounds of the four runs (at least 1: the medians need a run).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
        /// Epochs per run.
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
        epochs: u64,
    },
    /// Mutation testing with cargo-mutants of the strategies and their stores, the run driver
    /// and its report, the layer library, the optimiser update, the CPU operations,
    /// checkpoints, the worker pool, the core contracts, the IDX reader and the image reader
    /// (the list is in .cargo/mutants.toml); the report goes to mutants.out/. Takes hours on 2
    /// cores.
    Mutants {
        /// Passed to cargo mutants, e.g. `--iterate` (only what was missed last time) or
        /// `--file crates/tandem-strategy/src/sync.rs`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> Result<()> {
    let root = workspace_root()?;
    match Cli::parse().command {
        Task::BuildKernels { check, pinned } => kernels::build(&root, check, pinned),
        Task::CudaEmu => emu::build(&root).map(|_| ()),
        Task::GpuBundle => bundle::build(&root),
        Task::BenchTrain { rounds, epochs } => bench::train(&root, rounds, epochs),
        Task::Mutants { args } => mutants::run_mutants(&root, &args),
    }
}

/// The workspace root: the parent of this crate's manifest folder.
fn workspace_root() -> Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("xtask's manifest folder has no parent")
}

/// Runs `command`, failing with its command line when it cannot start or exits non-zero.
fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("could not start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed ({status})");
    }
    Ok(())
}

/// Runs `command` and returns its standard output, failing like [`run`].
fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("could not start {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{command:?} printed non-UTF-8"))
}

/// `cargo metadata` of the workspace at `root`, with `option` (`--no-deps`, `--all-features`).
fn cargo_metadata(root: &Path, option: &str) -> Result<serde_json::Value> {
    let json = output(
        Command::new(env!("CARGO"))
            .args([
                "metadata",
                "--format-version",
                "1",
                option,
                "--manifest-path",
            ])
            .arg(root.join("Cargo.toml")),
    )?;
    serde_json::from_str(&json).context("parsing cargo metadata")
}
