//! `cargo xtask bench-train`: whole training runs of the release binary, sync and async at one
//! and two CPU workers, alternated round after round (these machines are noisy), with the median
//! examples/sec of each configuration and its fraction of the floor: the rate of a step's
//! matrix products alone on as many threads at once as there are workers (`gemm-floor` of
//! tandem-benches), measured just before and just after each run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};

use crate::{output, run};

/// The four configurations, in the order each round runs them.
const CONFIGS: [(&str, usize); 4] = [("sync", 1), ("async", 1), ("sync", 2), ("async", 2)];

pub fn train(root: &Path, rounds: u64, epochs: u64) -> Result<()> {
    run(Command::new(env!("CARGO")).current_dir(root).args([
        "build",
        "--release",
        "-q",
        "-p",
        "mnist-train",
        "-p",
        "tandem-benches",
        "--bin",
        "mnist-train",
        "--bin",
        "gemm-floor",
    ]))?;
    let binary = root.join("target/release/mnist-train");
    let floor_binary = root.join("target/release/gemm-floor");
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); CONFIGS.len()];
    // The floors measured, for one and two threads.
    let mut floors: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for round in 1..=rounds {
        for (i, (mode, workers)) in CONFIGS.iter().enumerate() {
            // The floor of this run: the products alone on as many threads at once, measured
            // just before it and just after it (the machine's speed drifts within seconds).
            let measure_floor = || {
                floor_rate(&output(
                    Command::new(&floor_binary).arg(workers.to_string()),
                )?)
            };
            let before = measure_floor()?;
            let text = output(Command::new(&binary).current_dir(root).args([
                &format!("--{mode}"),
                "--devices",
                &format!("cpu:{workers}"),
                "--epochs",
                &epochs.to_string(),
                "--log-every",
                "0",
            ]))?;
            let floor = (before + measure_floor()?) / 2.0;
            floors[workers - 1].push(floor);
            let rate = field(&text, "examples/sec:")?;
            let accuracy = field(&text, "test accuracy:")?;
            let ratio = rate / floor;
            println!(
                "round {round}: {mode:5} x{workers}: {rate:>8.0} examples/sec, floor {floor:>8.0} \
                 ({ratio:.2} of it), test accuracy {accuracy:.4}"
            );
            rates[i].push(rate);
            ratios[i].push(ratio);
        }
    }
    println!("\nmedian of {rounds} alternating runs, {epochs} epochs each:");
    for (threads, mut rates) in (1..).zip(floors) {
        println!(
            "gemm floor on {threads} thread(s): {:.0} examples/sec",
            median(&mut rates)
        );
    }
    println!(
        "{:<6} {:>7} {:>14} {:>10}",
        "mode", "workers", "examples/sec", "of floor"
    );
    for (((mode, workers), mut runs), mut ratio) in CONFIGS.iter().zip(rates).zip(ratios) {
        println!(
            "{mode:<6} {workers:>7} {:>14.0} {:>10.2}",
            median(&mut runs),
            median(&mut ratio)
        );
    }
    Ok(())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The examples/sec of `gemm-floor`'s line.
fn floor_rate(text: &str) -> Result<f64> {
    text.split(',')
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.parse().ok())
        .with_context(|| format!("no rate in gemm-floor's output: {text}"))
}

/// The first number after `label` at the start of a line of the training summary.
fn field(text: &str, label: &str) -> Result<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|value| value.trim_end_matches(',').parse().ok())
        .with_context(|| format!("no {label:?} in the training output:\n{text}"))
}
