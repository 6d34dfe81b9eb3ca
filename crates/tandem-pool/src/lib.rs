//! The device pool: which devices to train on ([`DeviceSpec`], resolved against a GPU count
//! the caller supplies, so that the pool knows no CUDA) and [`WorkerPool`], which runs one
//! thread per replica.
//!
//! The pool knows nothing of any particular model or strategy (the replica trait a model
//! implements is [`tandem_core::Replica`]; a worker's state may be any `Send` type). Workers talk
//! to each other only through [`WorkerContext`] (a barrier that a failing worker breaks, so
//! nobody waits forever) and whatever shared state a strategy hands them. A worker that fails
//! under [`FailurePolicy::Continue`] is retired for the pool's life ([`WorkerPool::retired`]),
//! and [`WorkerPool::run_watched`] runs a watcher beside the workers that sees, through
//! [`RunWatch`], which of them make progress, without slowing them down.
//!
//! ```
//! use tandem_pool::{DeviceSpec, FailurePolicy, GpuCount, WorkerPool};
//!
//! let devices = "cpu:3".parse::<DeviceSpec>().unwrap().resolve(|| GpuCount::NoCuda).unwrap();
//! assert_eq!(devices.len(), 3);
//! // Any Send type can be a worker's state; a model replica is the usual one.
//! let mut pool = WorkerPool::new(devices, |device| Ok::<_, std::io::Error>(device.to_string())).unwrap();
//! let results = pool.run(FailurePolicy::StopAll, |ctx, name| {
//!     ctx.barrier()?; // every worker arrives before any leaves
//!     Ok(format!("{name} was worker {} of {}", ctx.worker(), ctx.workers()))
//! });
//! assert_eq!(results.into_results().unwrap()[2], "cpu:2 was worker 2 of 3");
//! ```
#![warn(missing_docs)]

mod device;
mod workers;

pub use device::{Device, DeviceError, DeviceSpec, DriverError, GpuCount, MAX_REPLICAS};
pub use workers::{
    Aborted, FailurePolicy, RunOutcome, RunWatch, WorkerActivity, WorkerContext, WorkerFailure,
    WorkerPool,
};
