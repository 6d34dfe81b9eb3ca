//! The MNIST splits as the model consumes them, and accuracy.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tandem_core::{Optimizer, TrainState};
use tandem_mnist::{Mnist, Split};
use tandem_model::{Mlp, Network};
use tandem_tensor::{CpuBackend, ExampleSet};

use crate::model::evaluated;

/// The reference's three splits (55,000 training, 5,000 validation, 10,000 test).
pub struct Data {
    pub train: ExampleSet,
    pub validation: ExampleSet,
    pub test: ExampleSet,
}

fn examples(split: Split) -> Result<ExampleSet> {
    split
        .into_examples()
        .context("an MNIST split with mismatched images and labels")
}

/// The environment variable that names the MNIST folder when `--data-dir` is not given.
pub const DATA_DIR_VARIABLE: &str = "TANDEM_MNIST_DIR";

/// Where the MNIST files are when `--data-dir` is not given: `$TANDEM_MNIST_DIR`, else
/// `data/mnist` under the current directory (a checkout of this repository keeps a copy there,
/// so `cargo run` from its root finds it). Never a path of the machine that built the binary.
pub fn default_data_dir() -> PathBuf {
    std::env::var_os(DATA_DIR_VARIABLE).map_or_else(|| PathBuf::from("data/mnist"), PathBuf::from)
}

/// Loads the four IDX files from `dir` (default: [`default_data_dir`]).
pub fn load(dir: Option<&Path>) -> Result<Data> {
    let mnist = match dir {
        Some(dir) => Mnist::load(dir)?,
        None => {
            let dir = default_data_dir();
            if !dir.is_dir() {
                anyhow::bail!(
                    "no MNIST data in {}: pass --data-dir DIR (the folder of the four IDX \
                     files), set {DATA_DIR_VARIABLE}, or run from the root of tandem's \
                     repository, which keeps a copy in data/mnist",
                    dir.display()
                );
            }
            Mnist::load(&dir)?
        }
    };
    Ok(Data {
        train: examples(mnist.train)?,
        validation: examples(mnist.validation)?,
        test: examples(mnist.test)?,
    })
}

/// Accuracy of the parameters the optimiser evaluates (its moving average) and of the raw
/// parameters on one split.
#[derive(Debug, Clone, Copy)]
pub struct Accuracy {
    pub averaged: f64,
    pub raw: f64,
}

/// The accuracies of `state`, a state of `mlp` and `optimizer`, on `examples`.
pub fn accuracy(
    mlp: &Mlp,
    state: &TrainState,
    optimizer: &dyn Optimizer,
    examples: &ExampleSet,
) -> Result<Accuracy> {
    Ok(Accuracy {
        averaged: mlp.evaluate(&CpuBackend, evaluated(state, optimizer)?, examples)?,
        raw: mlp.evaluate(&CpuBackend, &state.params, examples)?,
    })
}

/// The accuracy of always answering the commonest label of `examples` (0 for none).
pub fn chance_accuracy(examples: &ExampleSet) -> f64 {
    let mut counts = [0usize; 256];
    for i in 0..examples.len() {
        counts[usize::from(examples.label(i))] += 1;
    }
    let commonest = counts.iter().copied().max().unwrap_or(0);
    commonest as f64 / examples.len().max(1) as f64
}

/// The summary's two accuracy lines (training and `eval` print the same).
pub fn accuracy_lines(validation: Accuracy, test: Accuracy) -> [String; 2] {
    [
        format!(
            "validation accuracy: {:.4} averaged, {:.4} raw",
            validation.averaged, validation.raw
        ),
        format!(
            "test accuracy:       {:.4} averaged, {:.4} raw",
            test.averaged, test.raw
        ),
    ]
}
