//! `mnist-train eval`: the accuracy of a checkpoint, as the training summary reports it, or of
//! an export, and the test set's confusion matrix.

use anyhow::Result;
use tandem_model::{Confusion, Network};
use tandem_tensor::CpuBackend;
use tandem_train::out;

use crate::cli::EvalArgs;
use crate::data::{self, Evaluator};
use crate::model::Inference;

/// `mnist-train eval`: prints the accuracies and the test set's confusion matrix.
pub fn run(args: &EvalArgs) -> Result<()> {
    // The file first: a bad one should fail before the data are read.
    let loaded = Inference::load(&args.checkpoint)?;
    let data = data::load(args.data_dir.as_deref())?;
    let mlp = loaded.mlp();
    match &loaded {
        Inference::Checkpoint(file, saved, config, _) => {
            let state = &saved.state;
            let host = Evaluator::Host;
            let validation = host.accuracy(mlp, state, &config.optimizer, &data.validation)?;
            let test = host.accuracy(mlp, state, &config.optimizer, &data.test)?;
            out!("checkpoint:          {}", file.display());
            out!(
                "step:                {} of {} ({}, {} worker(s), batch {} per worker)",
                state.step,
                config.end_step,
                config.mode.name(),
                config.workers,
                config.batches.batch_size
            );
            for line in data::accuracy_lines(validation, test) {
                out!("{line}");
            }
        }
        Inference::Export(file, export, _) => {
            let accuracy = |examples| Evaluator::Host.evaluate(mlp, &export.params, examples);
            let (validation, test) = (accuracy(&data.validation)?, accuracy(&data.test)?);
            out!("export:              {}", file.display());
            out!(
                "step:                {} (averaged parameters in {})",
                export.step,
                export.dtype
            );
            out!("validation accuracy: {validation:.4}");
            out!("test accuracy:       {test:.4}");
        }
    }

    let predictions = mlp.predictions(&CpuBackend, loaded.params()?, &data.test)?;
    let matrix = Confusion::new(mlp.classes(), data.test.labels(), &predictions);
    out!();
    out!(
        "confusion matrix of the averaged parameters on the test set ({} images)",
        data.test.len()
    );
    out!("rows: true label, columns: predicted label, '.': none");
    out!("{}", matrix.render().trim_end());
    Ok(())
}
