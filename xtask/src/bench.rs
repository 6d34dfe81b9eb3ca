//! `cargo xtask bench-train`: whole training runs of the release binary, sync and async at one
//! and two CPU workers, alternated round after round (these machines are noisy), with the median
//! examples/sec of each configuration.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::{output, run};

/// The four configurations, in the order each round runs them.
const CONFIGS: [(&str, usize); 4] = [("sync", 1), ("async", 1), ("sync", 2), ("async", 2)];

pub fn train(root: &Path, rounds: usize, epochs: u64) -> Result<()> {
    run(Command::new(env!("CARGO")).current_dir(root).args([
        "build",
        "--release",
        "-q",
        "-p",
        "mnist-train",
    ]))?;
    let binary = root.join("target/release/mnist-train");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    for round in 1..=rounds {
        for (i, (mode, workers)) in CONFIGS.iter().enumerate() {
            let text = output(Command::new(&binary).current_dir(root).args([
                &format!("--{mode}"),
                "--devices",
                &format!("cpu:{workers}"),
                "--epochs",
                &epochs.to_string(),
                "--log-every",
                "0",
            ]))?;
            let rate = field(&text, "examples/sec:")?;
            let accuracy = field(&text, "test accuracy:")?;
            println!("round {round}: {mode:5} x{workers}: {rate:>8.0} examples/sec, test accuracy {accuracy:.4}");
            rates[i].push(rate);
        }
    }
    println!("\nmedian of {rounds} alternating runs, {epochs} epochs each:");
    println!("{:<6} {:>7} {:>14}", "mode", "workers", "examples/sec");
    for ((mode, workers), mut runs) in CONFIGS.iter().zip(rates) {
        runs.sort_by(f64::total_cmp);
        println!("{mode:<6} {workers:>7} {:>14.0}", runs[runs.len() / 2]);
    }
    Ok(())
}

/// The first number after `label` at the start of a line of the training summary.
fn field(text: &str, label: &str) -> Result<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.trim_end_matches(',').parse().ok())
        .with_context(|| format!("no {label:?} in the training output:\n{text}"))
}
