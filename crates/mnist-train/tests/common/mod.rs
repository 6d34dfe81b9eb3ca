//! What the end-to-end tests share: running the binary and reading what it said.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A command running the `mnist-train` binary, without backtraces (messages are compared),
/// with the repository's MNIST copy as its default data (tests run in the crate's folder),
/// evaluating on the CPU unless `--eval-on` says otherwise: under the driver stand-in a run
/// without `--devices` trains on its GPUs, and it interprets a GPU evaluation's 30,000
/// forward passes in minutes (`gpu_training.rs` runs one).
pub fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mnist-train"));
    command
        .args(args)
        .env("TANDEM_MNIST_DIR", data_dir())
        .env("TANDEM_EVAL_ON", "cpu")
        .env("RUST_BACKTRACE", "0")
        .env("RUST_LIB_BACKTRACE", "0");
    command
}

/// Runs `mnist-train` to the end.
pub fn mnist_train(args: &[&str]) -> Output {
    command(args).output().expect("cannot run mnist-train")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs mnist-train and returns its stdout, failing the test with its stderr if it failed.
pub fn succeed(args: &[&str]) -> String {
    let output = mnist_train(args);
    assert!(
        output.status.success(),
        "mnist-train {args:?} failed:\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Runs mnist-train, asserts that it failed cleanly (an error, not a panic), and returns its
/// stderr.
pub fn fail(args: &[&str]) -> String {
    let output = mnist_train(args);
    let message = stderr(&output);
    assert!(
        !output.status.success(),
        "mnist-train {args:?} succeeded:\n{}\n{message}",
        stdout(&output)
    );
    assert!(!message.contains("panicked"), "{args:?}: {message}");
    assert_ne!(output.status.code(), Some(101), "{args:?}: {message}");
    message
}

pub fn line_starting<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"))
}

/// The MNIST data for the runs ([`tandem_testkit::mnist_dir`]).
pub fn data_dir() -> PathBuf {
    tandem_testkit::mnist_dir()
}

/// A path as a command-line argument.
pub fn arg(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}
