//! What the GPU test files share: opening a CUDA device, or skipping where there is none.
//!
//! Without a device (no GPU, or the stand-in with `TANDEM_EMU_DEVICES=0`) a test says
//! `SKIPPED: <test>: no CUDA device (...)` on stderr and returns; with
//! `TANDEM_REQUIRE_GPU=1` (CI, against the driver stand-in; the GPU bundle) it fails instead,
//! so that a run meant to exercise the GPU code cannot pass without doing so. Any other failure
//! to open the device fails the test.

#![allow(dead_code)] // each test binary uses its own part of this module

use std::fmt::Display;
use std::io::Write;

use tandem_kernels::KernelError;

/// The variable that turns a missing device into a failure.
pub const REQUIRE_GPU: &str = "TANDEM_REQUIRE_GPU";

/// Whether this run requires a device (`TANDEM_REQUIRE_GPU=1`).
pub fn gpu_required() -> bool {
    std::env::var_os(REQUIRE_GPU).is_some_and(|v| v == "1")
}

/// `Some` of what opening a device gave; `None` after [`no_device`] where there is none.
pub fn or_skip<T>(opened: Result<T, KernelError>) -> Option<T> {
    match opened {
        Ok(value) => Some(value),
        Err(e) if e.is_no_device() => {
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
        // Straight to the process's stderr, in one write: the test harness captures
        // `eprintln!` of passing tests, and a skip must never pass silently.
        Ok(skipped) => {
            let _ = std::io::stderr().write_all(skipped.as_bytes());
        }
        Err(failure) => panic!("{failure}"),
    }
}

/// What [`no_device`] does for `test`: `Ok` with the line that says it is skipped, or `Err`
/// with why it fails.
pub fn verdict(test: &str, reason: &dyn Display, required: bool) -> Result<String, String> {
    match required {
        true => Err(format!(
            "{test}: {REQUIRE_GPU}=1 but there is no CUDA device ({reason})"
        )),
        false => Ok(format!("SKIPPED: {test}: no CUDA device ({reason})\n")),
    }
}
