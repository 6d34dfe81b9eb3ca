//! `mnist-train`: trains the TensorFlow multi-GPU MNIST example's network (784-500-10 ReLU)
//! data-parallel, and evaluates, uses and compares what it trained. `--help` explains every
//! flag.

mod cli;
mod compare;
mod data;
mod eval;
mod model;
mod predict;
mod train;

use anyhow::{bail, Result};
use clap::Parser;
use tandem_train::output;

use cli::{Cli, Command};

/// How many processes `mpirun` started with this one, as Open MPI (or a PMI launcher such as
/// MPICH's) tells each of them.
fn launched_ranks() -> usize {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|name| std::env::var(name).ok()?.parse().ok())
        .unwrap_or(1)
}

/// Refuses what would silently run once per process under `mpirun`: training in a build
/// without the transport (each process would train on its own, all into one directory), and
/// the subcommands (each would write the same outputs).
fn check_launch(command: &Option<Command>) -> Result<()> {
    let ranks = launched_ranks();
    if ranks <= 1 {
        return Ok(());
    }
    if command.is_some() {
        bail!(
            "eval, predict and compare run in one process; mpirun started {ranks}: run them \
             without mpirun"
        );
    }
    if !cfg!(feature = "mpi") {
        bail!(
            "mpirun started {ranks} processes, but this build has no MPI transport: each would \
             train on its own; build with --features mpi (README: Across processes and hosts)"
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    check_launch(&cli.command)?;
    let result = match cli.command {
        // Its exit status comes after the run's resources (MPI, with the `mpi` feature) are
        // released.
        None => train::run(&cli.train).map(|status| {
            if let Some(status) = status {
                std::process::exit(status)
            }
        }),
        Some(Command::Eval(args)) => eval::run(&args),
        Some(Command::Predict(args)) => predict::run(&args),
        Some(Command::Compare(args)) => compare::run(&args),
    };
    if let Some(status) = output::failure_status() {
        if let Err(e) = result {
            output::warn(format!("Error: {e:?}"));
        }
        std::process::exit(status);
    }
    result
}
