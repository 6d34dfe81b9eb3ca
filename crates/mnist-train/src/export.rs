//! `mnist-train export`: a checkpoint's averaged parameters in 16 bits, for inference.

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Result};
use tandem_checkpoint as checkpoint;
use tandem_model::Network;
use tandem_train::out;

use crate::cli::ExportArgs;
use crate::model::{evaluated, load_checkpoint, FORMAT};

/// `mnist-train export`: writes the file and says what it holds.
pub fn run(args: &ExportArgs) -> Result<()> {
    let (file, saved, config, mlp) = load_checkpoint(&args.checkpoint)?;
    if args.out.is_dir() {
        bail!(
            "{} is a directory: give the file to write",
            args.out.display()
        );
    }
    // The file is replaced whole (written beside it, then renamed over it): what is not a
    // plain file (a device such as /dev/stdout, a pipe) would be replaced, not written to.
    if let Ok(existing) = std::fs::metadata(&args.out) {
        if !existing.is_file() {
            bail!(
                "{} exists and is not a regular file: the export replaces its file whole, so \
                 give the path of a file",
                args.out.display()
            );
        }
    }
    if same_file(&args.out, &file) {
        bail!(
            "{} is the checkpoint itself: write the export to another file",
            args.out.display()
        );
    }
    let params = evaluated(&saved.state, &config.optimizer)?;
    let metadata = BTreeMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("model".to_string(), mlp.name()),
        ("exported_from".to_string(), file.display().to_string()),
    ]);
    let layout = mlp.layout();
    let step = saved.state.step;
    checkpoint::export(&args.out, params, &layout, args.dtype, step, &metadata)
        .map_err(|e| anyhow!("cannot export: {e}"))?;
    let size = std::fs::metadata(&args.out).map_or(0, |m| m.len());
    out!(
        "exported {} ({} parameters of {}, step {step}, averaged) as {} to {} ({size} bytes)",
        file.display(),
        params.len(),
        mlp.name(),
        args.dtype,
        args.out.display()
    );
    Ok(())
}

/// Whether `a` and `b` name the same existing file.
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(a), Ok(b)) if a == b)
}
