//! `mnist-train eval`: the accuracy of a checkpoint, as the training summary reports it, and its
//! confusion matrix on the test set.

use anyhow::Result;
use tandem_model::{Confusion, Network};
use tandem_tensor::CpuBackend;
use tandem_train::out;

use crate::cli::EvalArgs;
use crate::data;
use crate::model::{evaluated, load_checkpoint};

/// `mnist-train eval`: prints the accuracies and the test set's confusion matrix.
pub fn run(args: &EvalArgs) -> Result<()> {
    // The checkpoint first: a bad file should fail before the data are read.
    let (file, saved, config, mlp) = load_checkpoint(&args.checkpoint)?;
    let data = data::load(args.data_dir.as_deref())?;
    let state = &saved.state;
    let validation = data::accuracy(&mlp, state, &config.optimizer, &data.validation)?;
    let test = data::accuracy(&mlp, state, &config.optimizer, &data.test)?;

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

    let predictions = mlp.predictions(
        &CpuBackend,
        evaluated(state, &config.optimizer)?,
        &data.test,
    )?;
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
