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

use anyhow::Result;
use clap::Parser;
use tandem_train::output;

use cli::{Cli, Command};

fn main() -> Result<()> {
    let cli = Cli::parse();
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
