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
}
