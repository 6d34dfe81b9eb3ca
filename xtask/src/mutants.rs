//! `cargo xtask mutants`: mutation testing with cargo-mutants over the code that decides
//! training results, each mutant tested by the suites of the crates that can see it.
//!
//! The files, the test packages and the `mutants` profile (dependencies optimised, the
//! workspace's crates built quickly) live in `.cargo/mutants.toml`, so that a plain
//! `cargo mutants` run and this task agree; this task checks that cargo-mutants is installed and
//! passes on extra arguments (`--iterate` to retest only what was missed last time, `--file` to
//! narrow it down). The report is left in `mutants.out/`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

pub fn run_mutants(root: &Path, extra: &[String]) -> Result<()> {
    let version = Command::new(env!("CARGO"))
        .args(["mutants", "--version"])
        .output()
        .context("could not start `cargo mutants`")?;
    if !version.status.success() {
        bail!("cargo-mutants is not installed: `cargo install --locked cargo-mutants`");
    }
    let status = Command::new(env!("CARGO"))
        .current_dir(root)
        .arg("mutants")
        .args(extra)
        .status()
        .context("could not start `cargo mutants`")?;
    let report = root.join("mutants.out");
    println!(
        "report: {} (caught.txt, missed.txt, timeout.txt, unviable.txt)",
        report.display()
    );
    // cargo-mutants' own exit codes: 2 when mutants were missed, 3 when some timed out.
    match status.code() {
        Some(0) => Ok(()),
        Some(2) => bail!("some mutants were not caught by any test: see missed.txt"),
        Some(3) => bail!("some mutants timed out (no test failed, but they hang): see timeout.txt"),
        _ => bail!("cargo mutants failed ({status})"),
    }
}
