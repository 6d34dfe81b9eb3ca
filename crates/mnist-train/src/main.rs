//! `mnist-train`: trains the TensorFlow book's MNIST network (784-500-10 ReLU) data-parallel.

mod cli;
mod log;
mod setup;

use anyhow::Result;
use clap::Parser;

fn main() -> Result<()> {
    let cli = cli::Cli::parse();
    setup::train(&cli.train)
}
