//! Shared set-up for tandem's benchmarks (`cargo bench -p tandem-benches`): the real MNIST data
//! and random operands at the model's shapes.

use std::path::Path;

use rand::{Rng, SeedableRng};
use tandem_mnist::Mnist;
use tandem_tensor::{ExampleSet, Gemm};

/// Examples per worker and step in the benchmarks (the default batch).
pub const BATCH: usize = 100;
/// The model's input, hidden and output widths (784-500-10).
pub const INPUTS: usize = 784;
/// See [`INPUTS`].
pub const HIDDEN: usize = 500;
/// See [`INPUTS`].
pub const CLASSES: usize = 10;

/// The matrix products of one worker's training step at [`BATCH`], named: what no step can do
/// without, so their single-thread time is the floor of a CPU worker's step.
pub const STEP_PRODUCTS: [(&str, Gemm); 5] = [
    ("forward1 100x500x784", Gemm::nn(BATCH, HIDDEN, INPUTS)),
    ("forward2 100x10x500", Gemm::nn(BATCH, CLASSES, HIDDEN)),
    ("dW2 500x10x100 (A^T)", Gemm::tn(HIDDEN, CLASSES, BATCH)),
    ("dH 100x500x10 (B^T)", Gemm::nt(BATCH, HIDDEN, CLASSES)),
    ("dW1 784x500x100 (A^T)", Gemm::tn(INPUTS, HIDDEN, BATCH)),
];

/// The training split of the repository's MNIST copy.
pub fn mnist_train() -> ExampleSet {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/mnist");
    let mnist = Mnist::load(&dir).unwrap_or_else(|e| panic!("benchmarks need the MNIST data: {e}"));
    mnist.train.into_examples().expect("a consistent split")
}

/// `len` values uniform in [-1, 1), the same for a given seed.
pub fn random(len: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}
