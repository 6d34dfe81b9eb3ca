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

use anyhow::{Context, Result};

use crate::run;

pub fn run_mutants(root: &Path, extra: &[String]) -> Result<()> {
    let version = Command::new(env!("CARGO"))
        .args(["mutants", "--version"])
        .output()
        .context("could not start `cargo mutants`")?;
    if !version.status.success() {
        anyhow::bail!("cargo-mutants is not installed: `cargo install --locked cargo-mutants`");
    }
    run(Command::new(env!("CARGO"))
        .current_dir(root)
        .arg("mutants")
        .args(extra))?;
    println!(
        "report: {} (caught.txt, missed.txt, timeout.txt, unviable.txt)",
        root.join("mutants.out").display()
    );
    Ok(())
}
