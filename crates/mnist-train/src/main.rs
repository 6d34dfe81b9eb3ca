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

/// `error` and its causes in one line, each cause once: most errors here already name their
/// cause in their own message, which anyhow's report would print a second time.
pub(crate) fn describe(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1).map(ToString::to_string) {
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

fn main() {
    let cli = Cli::parse();
    let result = check_launch(&cli.command).and_then(|()| match cli.command {
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
    });
    if let Err(e) = &result {
        output::warn(format!("Error: {}", describe(e)));
    }
    if let Some(status) = output::failure_status() {
        std::process::exit(status);
    }
    if result.is_err() {
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_each_cause_once() {
        let io = std::io::Error::other("disk full");
        let named = anyhow::Error::new(io).context("cannot save: disk full");
        assert_eq!(describe(&named), "cannot save: disk full");
        let io = std::io::Error::other("disk full");
        let unnamed = anyhow::Error::new(io).context("cannot save");
        assert_eq!(describe(&unnamed), "cannot save: disk full");
    }
}
