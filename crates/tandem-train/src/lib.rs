//! The whole training run of any model that implements [`tandem_core::Replica`], as a library:
//! what `mnist-train` does, without MNIST.
//!
//! * [`Trainer`]: opens one replica per device ([`Model::open`]), starts fresh or resumes from
//!   the newest valid checkpoint with the configuration its metadata records
//!   ([`RunConfig`], [`Start`]), and trains a [`Plan`] of segments: a checkpoint every N steps
//!   (keeping K), an evaluation every N, a final checkpoint.
//! * [`Watch`]: what a run shows ([`Progress`]: a bar on a terminal or plain lines, and a
//!   JSON-lines metrics file) and what stops it ([`Interrupt`], a handle Ctrl-C or any thread
//!   triggers; the run stops after its current step with a checkpoint).
//! * [`output`]: stdout that never panics (a closed pipe stops a run like a Ctrl-C).
//! * `report` (feature `report`): the sync-vs-async comparison's table and charts.
//! * [`Launch`], [`drive`], [`print_summary`]: the run as a command runs it (`mpirun`, rank
//!   roles, abort on error, the end-of-run summary); `cli` (feature `cli`): its flags.
//!
//! The optimiser is any [`RecordedOptimizer`] (tandem's [`Sgd`](tandem_optim::Sgd) is one):
//! its configuration is part of the run's identity in checkpoint metadata.
//!
//! `examples/linear_regression.rs` trains a model tandem does not ship through the trainer,
//! both modes, with a checkpoint and a resume.
#![warn(missing_docs)]

#[cfg(feature = "cli")]
pub mod cli;
mod config;
mod error;
mod interrupt;
#[macro_use]
pub mod output;
mod launch;
mod plan;
mod progress;
#[cfg(feature = "report")]
pub mod report;
#[cfg(test)]
mod scalar;
mod trainer;

pub use config::{
    ModelId, RunConfig, ASYNC_BOUND, ASYNC_RULE, ASYNC_WARMUP, EXCHANGE, LOSS_SCALE, LR_SCALING,
    MAX_STEPS, MAX_WORKERS, PRECISION,
};
pub use error::{Conflict, NotThisRun, RunError};
pub use interrupt::Interrupt;
pub use launch::{
    describe, drive, launched_ranks, print_summary, Ended, Launch, LaunchError, Shown,
};
pub use plan::Plan;
pub use progress::{Display, Progress, DEFAULT_LOG_EVERY};
pub use tandem_core::{DType, Precision};
pub use tandem_optim::{MetadataError, RecordedOptimizer};
pub use tandem_strategy::{AsyncRule, BatchScaling, Exchange, Mode, StalenessBound, Warmup};
pub use trainer::{
    check_checkpoint, Checkpoints, EvaluateError, Fresh, Length, LossScaling, Model, Requested,
    Resume, Segment, Setup, Start, Summary, Totals, Trainer, Watch,
};
