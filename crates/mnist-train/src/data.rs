//! The MNIST splits as the model consumes them, and accuracy.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tandem_core::{Optimizer, TrainState};
use tandem_mnist::{Mnist, Split};
use tandem_model::{Mlp, Network};
use tandem_pool::Device;
use tandem_tensor::{CpuBackend, ExampleSet};

use crate::cli::EvalOn;
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

/// Where accuracy is computed: on the host, or on a GPU, where the parameters and the
/// examples go once an evaluation and each chunk of 1,000 examples sends back its count of
/// correct answers (the logits stay there).
pub enum Evaluator {
    /// On the host's CPU.
    Host,
    /// On this GPU (computing in `f32`, as the host does).
    #[cfg(feature = "cuda")]
    Gpu(Box<tandem_kernels::CudaBackend>),
}

impl Evaluator {
    /// Where a run training on `devices` evaluates, as `--eval-on` says: on the first GPU of
    /// `devices` (opened now), or the host; the host, with a warning, where that GPU cannot be
    /// opened (the run's replicas already have it, so this is rare, and no reason to stop).
    pub fn for_run(eval_on: EvalOn, devices: &[Device]) -> Evaluator {
        let gpu = devices.iter().find_map(|device| match device {
            Device::Cuda { ordinal } => Some(*ordinal),
            _ => None,
        });
        match (eval_on, gpu) {
            #[cfg(feature = "cuda")]
            (EvalOn::Auto, Some(ordinal)) => match tandem_kernels::CudaBackend::new(ordinal) {
                Ok(gpu) => Evaluator::Gpu(Box::new(gpu)),
                Err(error) => {
                    tandem_train::output::warn(format!(
                        "warning: evaluating on the CPU: cannot open cuda:{ordinal}: {error}"
                    ));
                    Evaluator::Host
                }
            },
            _ => Evaluator::Host,
        }
    }

    /// The fraction of `examples` that `params`, parameters of `mlp`, classify correctly. A
    /// GPU that fails is warned of, and the host computes it instead.
    pub fn evaluate(&self, mlp: &Mlp, params: &[f32], examples: &ExampleSet) -> Result<f64> {
        match self {
            Evaluator::Host => Ok(mlp.evaluate(&CpuBackend, params, examples)?),
            #[cfg(feature = "cuda")]
            Evaluator::Gpu(gpu) => mlp.evaluate(&**gpu, params, examples).or_else(|error| {
                tandem_train::output::warn(format!(
                    "warning: evaluating on the CPU: the GPU's evaluation failed: {error}"
                ));
                Evaluator::Host.evaluate(mlp, params, examples)
            }),
        }
    }

    /// The accuracies of `state`, a state of `mlp` and `optimizer`, on `examples`.
    pub fn accuracy(
        &self,
        mlp: &Mlp,
        state: &TrainState,
        optimizer: &dyn Optimizer,
        examples: &ExampleSet,
    ) -> Result<Accuracy> {
        Ok(Accuracy {
            averaged: self.evaluate(mlp, evaluated(state, optimizer)?, examples)?,
            raw: self.evaluate(mlp, &state.params, examples)?,
        })
    }
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
