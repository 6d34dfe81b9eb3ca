//! The whole training run of any model that implements [`tandem_core::Replica`], as a library.
#![warn(missing_docs)]

#[cfg(feature = "report")]
pub mod report;

/// Synchronous or asynchronous data parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Averaged gradients, one identical update per step ([`tandem_strategy::sync`]).
    Sync,
    /// Each worker updates the shared parameters on its own ([`tandem_strategy::asynchronous`]).
    Async,
}

impl Mode {
    /// `"sync"` or `"async"`, as flags, metadata and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Sync => "sync",
            Mode::Async => "async",
        }
    }
}
