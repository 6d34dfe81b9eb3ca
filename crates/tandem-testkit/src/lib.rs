//! What tandem's tests share across crates: where the MNIST data are ([`mnist_dir`]) and what a
//! GPU test does where there is no device ([`or_skip`], [`no_device`]) or cannot run for
//! another reason ([`skipped`]).
//!
//! Without a device (no GPU, or the driver stand-in with `TANDEM_EMU_DEVICES=0`) a GPU test
//! says `SKIPPED: <test>: no CUDA device (...)` on stderr and returns; with
//! `TANDEM_REQUIRE_GPU=1` (CI, against the driver stand-in; the GPU bundle) it fails instead,
//! so that a run meant to exercise the GPU code cannot pass without doing so. Any other failure
//! to open the device fails the test.
//!
//! The crate depends on no other tandem crate, so that any of them can dev-depend on it: the
//! GPU helpers are generic over the error of opening a device, and the caller says which errors
//! mean "no device" (`tandem_kernels::KernelError::is_no_device`).

use std::fmt::Display;
use std::io::Write;
use std::path::PathBuf;

/// The variable that turns a missing device into a failure.
pub const REQUIRE_GPU: &str = "TANDEM_REQUIRE_GPU";

/// The variable naming another MNIST directory (set by the GPU bundle, which runs far from
/// this checkout).
pub const MNIST_DIR: &str = "TANDEM_MNIST_DIR";

/// The MNIST data for tests: `$TANDEM_MNIST_DIR` when it is set, else the repository's copy
/// (`data/mnist`).
pub fn mnist_dir() -> PathBuf {
    std::env::var_os(MNIST_DIR)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/mnist")))
}

/// Whether this run requires a device (`TANDEM_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU).is_some_and(|v| v == "1")
}

/// `Some` of what opening a device gave; `None` after [`no_device`] where there is none (an
/// error for which `is_no_device` is true). Any other error fails the test.
pub fn or_skip<T, E: Display>(
    opened: Result<T, E>,
    is_no_device: impl Fn(&E) -> bool,
) -> Option<T> {
    match opened {
        Ok(value) => Some(value),
        Err(e) if is_no_device(&e) => {
            no_device(&e, gpu_required());
            None
        }
        Err(e) => panic!("opening a CUDA device: {e}"),
    }
}

/// There is no device, for `reason`: fails the test when one is `required`, else says on
/// stderr that it is skipped.
pub fn no_device(reason: &dyn Display, required: bool) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    match verdict(&test, reason, required) {
        Verdict::Skip(line) => say(&line),
        Verdict::Fail(why) => panic!("{why}"),
    }
}

/// Says on stderr that the calling test is skipped, for `reason` (`SKIPPED: <test>: <reason>`):
/// for a skip that no device decides, such as a test whose evidence only the driver stand-in
/// gives, on NVIDIA's driver.
pub fn skipped(reason: &dyn Display) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    say(&format!("SKIPPED: {test}: {reason}\n"));
}

/// Straight to the process's stderr, in one write: the test harness captures `eprintln!` of
/// passing tests, and a skip must never pass silently.
fn say(line: &str) {
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// What [`no_device`] does for a test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// It is skipped, and this line says so.
    Skip(String),
    /// It fails, for this reason.
    Fail(String),
}

/// What [`no_device`] does for `test`.
pub fn verdict(test: &str, reason: &dyn Display, required: bool) -> Verdict {
    match required {
        true => Verdict::Fail(format!(
            "{test}: {REQUIRE_GPU}=1 but there is no CUDA device ({reason})"
        )),
        false => Verdict::Skip(format!("SKIPPED: {test}: no CUDA device ({reason})\n")),
    }
}

/// A run that takes longer than this hangs: the test fails rather than waits forever.
pub const DEADLINE: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `f` on its own thread and fails the test, naming `what`, if it has not returned within
/// [`DEADLINE`] (or if it panicked).
pub fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(value) => value,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("{what} did not finish within {DEADLINE:?}: a worker hangs")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what} panicked (see above)")
        }
    }
}
