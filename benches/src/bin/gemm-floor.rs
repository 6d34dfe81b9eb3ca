//! The floor of a CPU worker's step: the single-thread time of its matrix products
//! ([`STEP_PRODUCTS`], through `tandem_tensor::cpu::matmul`, i.e. the `gemm` crate), as
//! examples/sec a core. `cargo xtask bench-train` runs it beside each round of trainings, so
//! that the training rates are read as a fraction of the floor measured on the same machine at
//! the same time.
//!
//! Prints `gemm floor: T ms a step of B examples, R examples/sec a core`.

use std::time::Instant;

use tandem_benches::{random, BATCH, STEP_PRODUCTS};
use tandem_tensor::cpu;

/// Steps' worth of products timed together, and how many such timings the median is of.
const STEPS_PER_SAMPLE: usize = 20;
const SAMPLES: usize = 15;

fn main() {
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
    let mut seconds: Vec<f64> = (0..SAMPLES)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..STEPS_PER_SAMPLE {
                step();
            }
            start.elapsed().as_secs_f64() / STEPS_PER_SAMPLE as f64
        })
        .collect();
    seconds.sort_by(f64::total_cmp);
    let per_step = seconds[SAMPLES / 2];
    println!(
        "gemm floor: {:.3} ms a step of {BATCH} examples, {:.0} examples/sec a core",
        per_step * 1e3,
        BATCH as f64 / per_step
    );
}
