//! Asking a run to stop: a handle, set from a signal handler or any thread.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;

use crate::{output, RunError};

/// A request to stop a run cleanly after its current step, with a checkpoint. Clones share
/// the request.
#[derive(Debug, Clone, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// A handle nobody has triggered yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle that Ctrl-C (SIGINT, and SIGTERM) triggers. The first signal asks the run to
    /// stop after the current step and says so on stderr; a second ends the process at once
    /// with status 130, keeping only the checkpoints already written (the user asked twice).
    /// A process has one such handler: a second call fails.
    pub fn on_ctrl_c() -> Result<Self, RunError> {
        let interrupt = Self::new();
        let handle = interrupt.clone();
        let signals = AtomicU8::new(0);
        ctrlc::set_handler(move || {
            if signals.fetch_add(1, Ordering::SeqCst) == 0 {
                handle.request();
                output::warn(
                    "\ninterrupted: finishing the current step and saving (Ctrl-C again to exit \
                     at once, keeping only the checkpoints already written)",
                );
            } else {
                std::process::exit(130);
            }
        })
        .map_err(RunError::CtrlC)?;
        Ok(interrupt)
    }

    /// Asks the run to stop.
    pub fn request(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether a stop was asked for.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_the_request() {
        let a = Interrupt::new();
        let b = a.clone();
        assert!(!b.requested());
        a.request();
        assert!(b.requested());
        assert!(!Interrupt::new().requested());
    }

    /// Not a test of its own: what [`ctrl_c_asks_once_then_ends_the_process`] runs (with
    /// `--ignored`) in a process of its own (a process has one signal handler).
    #[cfg(unix)]
    #[test]
    #[ignore = "the child process of ctrl_c_asks_once_then_ends_the_process"]
    fn ctrl_c_child() {
        assert!(
            std::env::var_os("TANDEM_TEST_CTRL_C").is_some(),
            "run by ctrl_c_asks_once_then_ends_the_process, which sets TANDEM_TEST_CTRL_C"
        );
        let interrupt = Interrupt::on_ctrl_c().unwrap();
        assert!(matches!(Interrupt::on_ctrl_c(), Err(RunError::CtrlC(_))));
        assert!(!interrupt.requested());
        // ctrlc runs the handler on a thread of its own: wait for it, a bounded while.
        let requested_after_one = |signal| {
            // SAFETY: raising a signal this process handles.
            assert_eq!(unsafe { libc::raise(signal) }, 0);
            (0..1000).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                interrupt.requested()
            })
        };
        eprintln!("requested {}", requested_after_one(libc::SIGTERM));
        // The second signal ends the process; a handler that does not leaves it to return 0.
        unsafe { libc::raise(libc::SIGINT) };
        std::thread::sleep(std::time::Duration::from_secs(10));
    }

    #[cfg(unix)]
    #[test]
    fn ctrl_c_asks_once_then_ends_the_process() {
        let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "interrupt::tests::ctrl_c_child",
                "--ignored",
                "--nocapture",
            ])
            .env("TANDEM_TEST_CTRL_C", "1")
            .output()
            .expect("running the child");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(130), "{stderr}");
        assert!(stderr.contains("requested true"), "{stderr}");
        assert_eq!(
            stderr.matches("interrupted: finishing").count(),
            1,
            "{stderr}"
        );
    }
}
