//! Shared set-up for tandem's benchmarks (`cargo bench -p tandem-benches`): the real MNIST data
//! and random operands at the model's shapes.

use std::path::Path;

use rand::{Rng, SeedableRng};
use tandem_mnist::Mnist;
use tandem_tensor::ExampleSet;

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
