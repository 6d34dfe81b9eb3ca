//! `mnist-train predict`: classifies image files of handwritten digits with a checkpoint.
//!
//! Reading an image file (hostile input, checked before anything is allocated for it) and
//! making it look like an MNIST digit is `tandem_mnist::image`'s; this is the command around
//! it.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use tandem_mnist::image::digit_from_file;
use tandem_model::Mlp;

use crate::cli::PredictArgs;
use crate::eval::load_checkpoint;

/// The exit status of a program whose output pipe was closed, as a shell reports a process
/// killed by SIGPIPE (128 + 13).
const BROKEN_PIPE_STATUS: i32 = 141;

/// `mnist-train predict`: prints `PATH: DIGIT (p = PROBABILITY)` for each image, or
/// `PATH: no digit found` for a blank one.
pub fn run(args: &PredictArgs) -> Result<()> {
    let saved = load_checkpoint(&args.checkpoint)?;
    // Every image gets its line or its error: one unreadable file should not hide the answers
    // for the others, but it must still fail the command.
    let mut failures = Vec::new();
    for path in &args.images {
        let answer = match classify(&saved.state.ema, path) {
            Ok(Some((digit, p))) => format!("{digit} (p = {p:.3})"),
            Ok(None) => "no digit found".to_owned(),
            Err(e) => {
                failures.push(format!("{e:#}"));
                continue;
            }
        };
        // Locked and written by hand rather than with println!, which panics when the reader
        // has gone away (`predict ... | head -1`).
        if let Err(e) = writeln!(io::stdout().lock(), "{}: {answer}", path.display()) {
            if e.kind() == io::ErrorKind::BrokenPipe {
                // Nobody reads the rest: stop quietly, as a filter killed by SIGPIPE would.
                std::process::exit(BROKEN_PIPE_STATUS);
            }
            return Err(e).context("cannot write to standard output");
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
fn classify(params: &[f32], path: &Path) -> Result<Option<(usize, f32)>> {
    // The error names the file and says what is wrong with it: nothing to add.
    let Some(x) = digit_from_file(path)? else {
        return Ok(None);
    };
    let probabilities = Mlp::MNIST
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
