//! `mnist-train predict`: classifies image files of handwritten digits with a checkpoint.
//!
//! Reading an image file (hostile input, checked before anything is allocated for it) and
//! making it look like an MNIST digit is `tandem_mnist::image`'s; this is the command around
//! it.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use tandem_mnist::image::digit_from_file;
use tandem_model::{Mlp, Network};
use tandem_train::{out, output};

use crate::cli::PredictArgs;
use crate::model::Inference;

/// `mnist-train predict`: prints `PATH: DIGIT (p = PROBABILITY)` for each image, or
/// `PATH: no digit found` for a blank one.
pub fn run(args: &PredictArgs) -> Result<()> {
    let loaded = Inference::load(&args.checkpoint)?;
    let (mlp, params) = (loaded.mlp(), loaded.params()?);
    // Every image gets its line or its error: one unreadable file should not hide the answers
    // for the others, but it must still fail the command.
    let mut failures = Vec::new();
    for path in &args.images {
        let answer = match classify(mlp, params, path) {
            Ok(Some((digit, p))) => format!("{digit} (p = {p:.3})"),
            Ok(None) => "no digit found".to_owned(),
            Err(e) => {
                failures.push(format!("{e:#}"));
                continue;
            }
        };
        out!("{}: {answer}", path.display());
        if output::closed() {
            // Nobody reads the rest (`predict ... | head -1`): main ends as SIGPIPE would.
            return Ok(());
        }
    }
    if !failures.is_empty() {
        let mut message = format!(
            "cannot classify {} of {} image(s):",
            failures.len(),
            args.images.len()
        );
        for failure in failures {
            let _ = write!(message, "\n  {failure}");
        }
        bail!(message);
    }
    Ok(())
}

/// The most probable digit of the image at `path` and its probability, or `None` for an image
/// with no digit in it (nothing but background).
fn classify(mlp: &Mlp, params: &[f32], path: &Path) -> Result<Option<(usize, f32)>> {
    // The error names the file and says what is wrong with it: nothing to add.
    let Some(x) = digit_from_file(path)? else {
        return Ok(None);
    };
    let probabilities = mlp
        .probabilities(params, &x)
        .with_context(|| format!("{}: cannot classify", path.display()))?;
    let digit = tandem_tensor::cpu::argmax(&probabilities);
    // The model always has ten classes; an empty answer would be a bug, reported rather than
    // panicking.
    let p = probabilities
        .get(digit)
        .copied()
        .ok_or_else(|| anyhow!("{}: the model gave no probabilities", path.display()))?;
    Ok(Some((digit, p)))
}
