//! `mnist-train`: trains the TensorFlow book's MNIST network (784-500-10 ReLU) data-parallel,
//! and evaluates, uses and compares what it trained. `--help` explains every flag.

mod cli;
mod data;
mod progress;
mod session;
mod train;

use anyhow::Result;
use clap::Parser;

use cli::Cli;

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        None => train::run(&cli.train),
    }
}
