//! The floor of CPU workers' steps: the time of a step's matrix products ([`STEP_PRODUCTS`],
//! through `tandem_tensor::cpu::matmul`, i.e. the `gemm` crate, one thread each) with
//! `THREADS` threads (the argument, default 1) running them at once, as examples/sec in all:
//! what that many workers could do if a step were nothing but its products. Threads at once,
//! because two threads on a machine's two cores often do not run at twice one's rate (shared
//! caches, or two hardware threads of one core). `cargo xtask bench-train` runs it beside each
//! round of trainings, so that the training rates are read as a fraction of the floor measured
//! on the same machine at the same time.
//!
//! Prints `gemm floor: T ms a step of B examples, R examples/sec on N thread(s)`.

use std::time::Instant;

use tandem_benches::{random, BATCH, STEP_PRODUCTS};
use tandem_tensor::cpu;

/// Steps' worth of products timed together, and how many such timings the mean is of: about
/// 2.5 seconds in all, so that the machine's swings in speed (a shared host's, over seconds)
/// weigh in the floor about as they do in a training run.
const STEPS_PER_SAMPLE: usize = 20;
const SAMPLES: usize = 100;

fn main() {
    let threads = match std::env::args().nth(1).map(|arg| arg.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => {
            eprintln!("usage: gemm-floor [THREADS] (a count of at least 1)");
            std::process::exit(2);
        }
    };
    let barrier = std::sync::Barrier::new(threads);
    let per_step: Vec<f64> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..threads)
            .map(|_| scope.spawn(|| seconds_a_step(&barrier)))
            .collect();
        runs.into_iter()
            .map(|run| run.join().unwrap_or_else(|_| std::process::exit(1)))
            .collect()
    });
    let mean = per_step.iter().sum::<f64>() / threads as f64;
    let rate: f64 = per_step.iter().map(|s| BATCH as f64 / s).sum();
    println!(
        "gemm floor: {:.3} ms a step of {BATCH} examples, {rate:.0} examples/sec on {threads} \
         thread(s)",
        mean * 1e3
    );
}

/// The mean time of a step's products on this thread over every sample, every thread timing at
/// once: the mean, not the median, because a training run's rate is its examples over its whole
/// time, the machine's stalls included, and the floor it is read against must count the same way.
fn seconds_a_step(barrier: &std::sync::Barrier) -> f64 {
    let mut operands: Vec<_> = STEP_PRODUCTS
        .iter()
        .enumerate()
        .map(|(i, (_, spec))| {
            let a = random(spec.m * spec.k, 2 * i as u64);
            let b = random(spec.k * spec.n, 2 * i as u64 + 1);
            (*spec, a, b, vec![0.0f32; spec.m * spec.n])
        })
        .collect();
    let mut step = || {
        for (spec, a, b, c) in &mut operands {
            cpu::matmul(*spec, a, b, c);
        }
    };
    // Warm the caches and the allocator's pages.
    for _ in 0..STEPS_PER_SAMPLE {
        step();
    }
    let seconds: f64 = (0..SAMPLES)
        .map(|_| {
            barrier.wait();
            let start = Instant::now();
            for _ in 0..STEPS_PER_SAMPLE {
                step();
            }
            start.elapsed().as_secs_f64()
        })
        .sum();
    seconds / (SAMPLES * STEPS_PER_SAMPLE) as f64
}
