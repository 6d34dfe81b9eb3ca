//! `mnist-train`: trains the TensorFlow multi-GPU MNIST example's network (784-500-10 ReLU)
//! data-parallel, and evaluates, uses and compares what it trained. `--help` explains every
//! flag.

mod cli;
mod compare;
mod data;
mod eval;
mod export;
mod model;
mod predict;
mod train;

use clap::Parser;
use tandem_train::{describe, output, Launch};

use cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    // A subcommand runs in one process: under mpirun each would write the same outputs.
    let one_process = cli.command.as_ref().map(|command| match command {
        Command::Eval(_) => "eval",
        Command::Predict(_) => "predict",
        Command::Compare(_) => "compare",
        Command::Export(_) => "export",
    });
    let result = Launch::init(one_process)
        .map_err(anyhow::Error::from)
        .and_then(|launch| match cli.command {
            // Its exit status comes after the run's resources (MPI, with the `mpi` feature)
            // are released.
            None => launch
                .or_abort(train::run(&cli.train, &launch))
                .map(|status| {
                    drop(launch);
                    if let Some(status) = status {
                        std::process::exit(status)
                    }
                }),
            Some(Command::Eval(args)) => eval::run(&args),
            Some(Command::Predict(args)) => predict::run(&args),
            Some(Command::Compare(args)) => compare::run(&args),
            Some(Command::Export(args)) => export::run(&args),
        });
    if let Err(e) = &result {
        output::warn(format!("Error: {}", describe(e.as_ref())));
    }
    if let Some(status) = output::failure_status() {
        std::process::exit(status);
    }
    if result.is_err() {
        std::process::exit(1);
    }
}
