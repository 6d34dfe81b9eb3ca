//! The MNIST splits as the model consumes them, and accuracy.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tandem_mnist::{Mnist, Split};
use tandem_model::Mlp;
use tandem_tensor::{CpuBackend, ExampleSet};

/// The book's three splits.
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

/// `data/mnist` of the current directory when it is there, else the repository's own copy.
pub fn default_data_dir() -> PathBuf {
    let local = PathBuf::from("data/mnist");
    if local.is_dir() {
        local
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/mnist")
    }
}

/// Loads the four IDX files from `dir` (default: [`default_data_dir`]).
pub fn load(dir: Option<&Path>) -> Result<Data> {
    let dir = dir.map_or_else(default_data_dir, Path::to_path_buf);
    let mnist = Mnist::load(&dir)?;
    Ok(Data {
        train: examples(mnist.train)?,
        validation: examples(mnist.validation)?,
        test: examples(mnist.test)?,
    })
}

/// Accuracy of the averaged and the raw parameters on one split.
#[derive(Debug, Clone, Copy)]
pub struct Accuracy {
    pub averaged: f64,
    pub raw: f64,
}

pub fn accuracy(params: &[f32], ema: &[f32], examples: &ExampleSet) -> Result<Accuracy> {
    Ok(Accuracy {
        averaged: Mlp::MNIST.evaluate(&CpuBackend, ema, examples)?,
        raw: Mlp::MNIST.evaluate(&CpuBackend, params, examples)?,
    })
}

/// The summary's two accuracy lines (training and `eval` print the same).
pub fn print_accuracy(validation: Accuracy, test: Accuracy) {
    out!(
        "validation accuracy: {:.4} averaged, {:.4} raw",
        validation.averaged,
        validation.raw
    );
    out!(
        "test accuracy:       {:.4} averaged, {:.4} raw",
        test.averaged,
        test.raw
    );
}
