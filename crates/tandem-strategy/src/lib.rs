//! Data-parallel training strategies over a [`tandem_pool::WorkerPool`] of replicas.
//!
//! [`train`] in one of two [`Mode`]s:
//!
//! * [`sync`]: every replica starts each step from the same parameters, computes
//!   gradients on its own shard of the global batch; the gradients are averaged in a fixed order
//!   and one identical update is applied (bitwise reproducible for a seed and worker count).
//! * [`asynchronous`]: each worker reads the latest parameters from a shared store,
//!   computes gradients on its own batch and applies its update at once, without waiting for the
//!   others (parameter-server style; updates can be stale, and staleness is measured).
//!
//! Both share everything else: the one definition of an epoch ([`Epochs`]), the data order
//! ([`Batches`], [`EpochOrder`]), the store of the parameters of record ([`ParamStore`]; in host
//! memory, [`HostStore`]), [`Observer`] callbacks and the [`TrainReport`]. Neither knows
//! anything of the model beyond the [`tandem_core::Replica`] trait, nor of the optimiser
//! beyond [`tandem_core::Optimizer`] (tandem's are in `tandem_optim`: SGD with exponential decay,
//! L2 and a moving average, the TensorFlow multi-GPU MNIST example's, and Adam); both train a
//! [`tandem_core::TrainState`] in place.
//!
//! ```
//! use tandem_core::{ParamSpan, Replica, ReplicaError, StepLoss, TrainState};
//! use tandem_pool::{Device, WorkerPool};
//! use tandem_optim::Sgd;
//! use tandem_strategy::{train, Batches, Mode, NoObserver};
//!
//! /// Fits y = w . x to a target w* = 3 on a data set where example i is x = i.
//! struct Scalar { layout: Vec<ParamSpan>, w: f32, grad: f32 }
//! impl Replica for Scalar {
//!     fn layout(&self) -> &[ParamSpan] { &self.layout }
//!     fn set_params(&mut self, fill: &mut dyn FnMut(&mut [f32])) -> Result<(), ReplicaError> {
//!         let mut p = [0.0]; fill(&mut p); self.w = p[0]; Ok(())
//!     }
//!     fn compute_gradients(&mut self, batch: &[u32]) -> Result<StepLoss, ReplicaError> {
//!         let n = batch.len() as f32;
//!         let (mut loss, mut grad) = (0.0, 0.0);
//!         for &i in batch {
//!             let x = i as f32 / 10.0;
//!             let err = self.w * x - 3.0 * x;
//!             loss += 0.5 * err * err / n;
//!             grad += err * x / n;
//!         }
//!         self.grad = grad;
//!         Ok(StepLoss::Known(loss))
//!     }
//!     fn read_gradients(&mut self, read: &mut dyn FnMut(&[f32])) -> Result<(), ReplicaError> {
//!         read(&[self.grad]); Ok(())
//!     }
//!     fn training_examples(&self) -> usize { 10 }
//! }
//!
//! let layout = vec![ParamSpan { name: "w".into(), shape: vec![1], weight_decay: false }];
//! let devices = (0..2).map(|worker| Device::Cpu { worker }).collect();
//! let mut pool = WorkerPool::new(devices, |_| {
//!     Ok::<_, ReplicaError>(Scalar { layout: layout.clone(), w: 0.0, grad: 0.0 })
//! }).unwrap();
//! let sgd = Sgd { learning_rate: 0.5, ..Sgd::default() };
//! let batches = Batches { batch_size: 5, seed: 1 };
//! let mut state = TrainState::new(vec![0.0], &sgd);
//! train(Mode::Sync, &mut pool, &mut state, &sgd, &batches, 200, &NoObserver).unwrap();
//! assert!((state.params[0] - 3.0).abs() < 1e-3);
//! ```
#![warn(missing_docs)]

pub mod asynchronous;
mod batch_scaling;
mod common;
mod device_store;
mod epochs;
mod exchange;
mod helping;
mod hyper;
mod order;
mod staleness;
mod store;
pub mod sync;

pub use batch_scaling::{BatchScaling, InvalidScaling};
pub use device_store::{DeviceAsyncStore, DeviceSyncStore};
pub use epochs::Epochs;
pub use exchange::{Exchange, UnknownExchange};
pub use hyper::Batches;
pub use order::EpochOrder;
pub use staleness::{
    AsyncRule, InvalidBound, InvalidWarmup, StalenessBound, Strategy, UnknownRule, Warmup,
    MAX_WARMUP_EPOCHS,
};
pub use store::{AsyncStore, HostStore, ParamStore, SyncStore, UpdateAt};

use std::time::Duration;

use tandem_collectives::Transport;
use tandem_core::{DType, Optimizer, Replica, ReplicaError, TrainState};
use tandem_pool::{WorkerFailure, WorkerPool};

use crate::store::{RankedAsyncStore, RankedSyncStore, Sends};

/// Synchronous or asynchronous data parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Averaged gradients, one identical update per step ([`sync`]).
    Sync,
    /// Each worker updates the shared parameters on its own ([`asynchronous`]).
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

/// Trains the replicas of `pool` from `state` with `optimizer` on `batches`, with `strategy`
/// (a [`Mode`], or a [`Strategy`] that also names the asynchronous [`AsyncRule`]), until
/// `state.step == end_step` (or the observer stops it), leaving the final parameters,
/// optimiser state and step in `state`. A sync step trains on every worker's batch; an async
/// step is one worker's update. [`sync`] and [`asynchronous`] say how each mode works.
///
/// A pool of simulated workers ([`tandem_pool::Device::Sim`], every one of them) trains as
/// that many equally fast, truly parallel workers would, taking turns on one core: bitwise
/// reproducibly, and asynchronous updates exactly N - 1 stale in steady state
/// ([`asynchronous`]).
pub fn train<R: Replica, O: Optimizer + ?Sized>(
    strategy: impl Into<Strategy>,
    pool: &mut WorkerPool<R>,
    state: &mut TrainState,
    optimizer: &O,
    batches: &Batches,
    end_step: u64,
    observer: &dyn Observer,
) -> Result<TrainReport, TrainError> {
    run(
        None,
        strategy.into(),
        pool,
        state,
        optimizer,
        batches,
        end_step,
        observer,
    )
}

/// [`train`] as one rank of a run that spans the processes of `transport`, each with a pool of
/// as many workers. Every rank calls it with the same arguments (and the same `state`) and ends
/// with the same `state`. The run's workers are every rank's, in rank order
/// ([`tandem_collectives`]): its global batch, data order and schedule are those of one
/// process with all of them, and a synchronous run's result is bitwise that one process's.
/// Step reports count every rank's examples. With one rank this is [`train`].
///
/// A synchronous run needs only the transport's collectives; an asynchronous one needs its
/// messages too ([`Transport::Ranks`]), and with them rank 0 names a rank that stops
/// ([`Stall::silent_ranks`]).
#[allow(clippy::too_many_arguments)]
pub fn train_across<R: Replica, O: Optimizer + ?Sized>(
    transport: Transport<'_>,
    strategy: impl Into<Strategy>,
    pool: &mut WorkerPool<R>,
    state: &mut TrainState,
    optimizer: &O,
    batches: &Batches,
    end_step: u64,
    observer: &dyn Observer,
) -> Result<TrainReport, TrainError> {
    let transport = (transport.collectives().ranks() > 1).then_some(transport);
    run(
        transport,
        strategy.into(),
        pool,
        state,
        optimizer,
        batches,
        end_step,
        observer,
    )
}

#[allow(clippy::too_many_arguments)]
fn run<R: Replica, O: Optimizer + ?Sized>(
    transport: Option<Transport<'_>>,
    Strategy {
        mode,
        rule,
        warmup,
        bound,
        batch_scaling,
        exchange,
    }: Strategy,
    pool: &mut WorkerPool<R>,
    state: &mut TrainState,
    optimizer: &O,
    batches: &Batches,
    end_step: u64,
    observer: &dyn Observer,
) -> Result<TrainReport, TrainError> {
    let ranks = transport.map(Transport::collectives);
    // A synchronous run's rate scaled for its global batch; at a factor of 1 (and in async
    // mode) every rate is multiplied by exactly 1, which changes no bit.
    let global_batch =
        batches.batch_size as u64 * pool.len() as u64 * ranks.map_or(1, |r| r.ranks() as u64);
    let optimizer = &batch_scaling::BatchScaled {
        inner: optimizer,
        factor: match mode {
            Mode::Sync => batch_scaling.factor(global_batch),
            Mode::Async => 1.0,
        },
    };
    let examples = common::validate(pool, state, optimizer, batches)?;
    let simulated = common::simulated(pool.devices(), ranks.is_some())?;
    let layout = pool.replicas()[0].layout().to_vec();
    let log_every = match ranks {
        Some(ranks) => {
            common::validate_across(ranks, pool, state, examples, end_step, observer.log_every())?
        }
        None => observer.log_every(),
    };
    // The first of the workers trains alone until the warm-up's end.
    let warmup_end = match mode {
        Mode::Sync => 0,
        Mode::Async => {
            let workers = pool.len() * ranks.map_or(1, |r| r.ranks());
            Epochs::new(examples, batches.batch_size as u64)
                .end_step(warmup.epochs(workers))
                .unwrap_or(u64::MAX)
        }
    };
    if ranks.is_some() && warmup_end > state.step {
        return Err(ConfigError::WarmupAcrossRanks.into());
    }
    if ranks.is_some() && mode == Mode::Async && bound != StalenessBound::Unbounded {
        return Err(ConfigError::BoundAcrossRanks(bound).into());
    }
    // In one process, a 16-bit exchange is the device store's (below).
    if exchange != Exchange::F32 && mode == Mode::Async {
        return Err(ConfigError::ExchangeUnused(exchange, "is asynchronous").into());
    }
    let leader = (0..pool.len()).find(|&w| !pool.is_retired(w)).unwrap_or(0);
    // Asynchronous across ranks, the store also keeps the counters (at rank 0's service);
    // simulated workers take turns.
    let computing = match (mode, bound) {
        (Mode::Async, StalenessBound::Wait(limit)) => Some(limit.saturating_add(1)),
        _ => None,
    };
    let counters = asynchronous::Counters::new(
        state.step,
        end_step,
        (leader, warmup_end),
        (pool.len(), computing),
    );
    let turns = asynchronous::Turns::new(&counters, (0..pool.len()).map(|w| !pool.is_retired(w)));
    let local: &dyn asynchronous::Schedule = match simulated {
        true => &turns,
        false => &counters,
    };
    let job = common::Job {
        pool,
        state,
        optimizer,
        batches,
        end_step,
        observer,
        examples,
        ranks,
        messages: transport.and_then(Transport::ranks),
        rule,
        bound,
        log_every,
    };
    // The parameters of record: across ranks, shared by every rank's workers; beside replicas
    // that compute on devices, on those devices; in host memory otherwise.
    match (mode, ranks) {
        (Mode::Sync, Some(ranks)) => {
            // The updated shares go back in 16 bits where every replica rounds to them anyway.
            let narrow = (job.pool.replicas().iter())
                .all(|r| exchange == Exchange::Bf16 && r.dtype() == DType::BF16);
            let sends = Sends {
                gradients: exchange,
                params: if narrow {
                    Exchange::Bf16
                } else {
                    Exchange::F32
                },
            };
            let local = job.pool.len();
            let store = RankedSyncStore::new(job.state, &layout, optimizer, ranks, local, sends);
            sync::run(job, &store)
        }
        (Mode::Sync, None) => {
            let replicas = job.pool.replicas();
            match DeviceSyncStore::open(replicas, job.state, &layout, optimizer, exchange)
                .map_err(TrainError::Device)?
            {
                Some(store) => sync::run(job, &store),
                None if exchange != Exchange::F32 => Err(ConfigError::ExchangeUnused(
                    exchange,
                    "is one process whose gradients meet in host memory (CPU workers, or \
                     more GPU replicas than one update sums)",
                )
                .into()),
                None => {
                    let store = HostStore::new(job.state, &layout, optimizer, job.pool.len());
                    sync::run(job, &store)
                }
            }
        }
        (Mode::Async, Some(_)) => {
            let ranks = job.messages.ok_or(ConfigError::AsyncWithoutMessages)?;
            let store = RankedAsyncStore::new(
                job.state,
                &layout,
                optimizer,
                ranks,
                job.pool.len(),
                // The asynchronous schedule's: a step is one worker's batch.
                (end_step, Epochs::new(examples, batches.batch_size as u64)),
                rule,
            );
            asynchronous::run(job, &store, &store)
        }
        (Mode::Async, None) => {
            let replicas = job.pool.replicas();
            // A lone replica's updates need no ordering against anybody's: the store of one
            // sync replica serves it, each update inside the next step's graph.
            if let [_] = replicas {
                let store =
                    DeviceSyncStore::open(replicas, job.state, &layout, optimizer, Exchange::F32)
                        .map_err(TrainError::Device)?;
                if let Some(store) = store {
                    return asynchronous::run(job, &store, local);
                }
            }
            match DeviceAsyncStore::open(replicas, job.state, &layout, optimizer)
                .map_err(TrainError::Device)?
            {
                Some(store) => asynchronous::run(job, &store, local),
                None => {
                    let store = HostStore::new(job.state, &layout, optimizer, job.pool.len());
                    asynchronous::run(job, &store, local)
                }
            }
        }
    }
}

/// What a strategy tells its observer every [`Observer::log_every`] steps.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The global step just completed (1-based: updates applied so far).
    pub step: u64,
    /// Mean data loss of the step's batch plus the L2 term (`weight_decay / 2 * sum w^2`).
    pub loss: f32,
    /// The learning rate the step used.
    pub learning_rate: f32,
    /// Examples processed by all workers since this run started.
    pub examples: u64,
    /// Wall time since this run started.
    pub elapsed: Duration,
    /// Asynchronous only: how many other updates landed between this update's read of the
    /// parameters and its own application.
    pub staleness: Option<u64>,
}

/// A worker that has made no progress for a while (see [`Observer::stall_timeout`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Stall {
    /// The worker's index.
    pub worker: usize,
    /// Its device.
    pub device: tandem_pool::Device,
    /// The global step it is on (1-based), if it has announced one.
    pub step: Option<u64>,
    /// How long it has gone without finishing a step.
    pub idle: Duration,
    /// Across ranks, on rank 0: the ranks it has not heard from for a while (no sign of life:
    /// stopped, hung as a whole, or gone), which every rank's steps wait for. Empty elsewhere.
    pub silent_ranks: Vec<SilentRank>,
}

/// A rank that has given rank 0 no sign of life for a while (see [`Stall::silent_ranks`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SilentRank {
    /// The rank.
    pub rank: usize,
    /// How long since rank 0 last heard from it.
    pub silence: Duration,
    /// The highest step its workers had announced then, if it had announced one.
    pub step: Option<u64>,
}

/// Hooks a strategy calls while it trains. `on_log` and `should_stop` are called from worker
/// threads; `should_stop`, `stall_timeout`, `stop_grace`, `on_stall` and `on_abandon` also from
/// the run's watchdog thread, which watches the workers for as long as a strategy's `train`
/// runs them.
pub trait Observer: Sync {
    /// How often to call [`on_log`](Self::on_log): after every this many global steps (0, the
    /// default: never).
    fn log_every(&self) -> u64 {
        0
    }

    /// Called after every [`log_every`](Self::log_every)-th global step.
    fn on_log(&self, report: &StepReport) {
        let _ = report;
    }

    /// Polled once a step (and by the watchdog); `true` ends the run cleanly after the current
    /// step.
    fn should_stop(&self) -> bool {
        false
    }

    /// How long a worker may go without finishing a step before [`on_stall`](Self::on_stall)
    /// reports it (`None`: never watch). A worker waiting at a barrier for the others is not
    /// stalled itself.
    fn stall_timeout(&self) -> Option<Duration> {
        None
    }

    /// Called from the watchdog thread, once per stall, when a worker has made no progress for
    /// [`stall_timeout`](Self::stall_timeout). If the worker makes progress again, a later stall
    /// is reported again.
    fn on_stall(&self, stall: &Stall) {
        let _ = stall;
    }

    /// Called once, from the watchdog thread, when [`should_stop`](Self::should_stop) has been
    /// true for [`stop_grace`](Self::stop_grace) while the run still has not ended because of
    /// workers that have made no progress for that long: the run cannot end while they hang
    /// (their threads cannot be stopped from outside). `state` is the last consistent state of
    /// record (`None` if there is none to give): synchronous, the state after the last step all
    /// workers completed; asynchronous, the store with every update it holds applied in full.
    /// A binary typically saves it and exits the process; if this returns, the run keeps
    /// waiting.
    fn on_abandon(&self, stalled: &[Stall], state: Option<&TrainState>) {
        let _ = (stalled, state);
    }

    /// How long after a stop request a run may take to end before
    /// [`on_abandon`](Self::on_abandon) (default 10 s).
    fn stop_grace(&self) -> Duration {
        Duration::from_secs(10)
    }
}

/// An observer that does nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoObserver;

impl Observer for NoObserver {}

/// Staleness of asynchronous updates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Staleness {
    /// Mean over all updates.
    pub mean: f64,
    /// The largest seen.
    pub max: u64,
    /// Gradients dropped for being staler than the run's [`StalenessBound::Drop`] (each
    /// computed anew, so not among the updates).
    pub dropped: u64,
}

/// How a run went.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// Updates applied in this run.
    pub steps: u64,
    /// Examples processed by all workers in this run.
    pub examples: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Asynchronous only.
    pub staleness: Option<Staleness>,
    /// Asynchronous only: workers that failed in this run while the others carried on. The pool
    /// retires them: [`tandem_pool::WorkerPool::retired`] lists every worker that later runs
    /// leave out.
    pub failures: Vec<WorkerFailure>,
    /// Whether the observer asked to stop before the last step.
    pub stopped: bool,
}

impl TrainReport {
    /// Examples per second over the run.
    pub fn examples_per_sec(&self) -> f64 {
        self.examples as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Why a configuration cannot train.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Simulated workers mixed with real ones: a simulation is all its workers' turns.
    #[error("simulated workers (sim:N) cannot train beside real ones")]
    SimulatedBesideReal,
    /// Simulated workers across processes.
    #[error("simulated workers (sim:N) train in one process, not across ranks")]
    SimulatedAcrossRanks,
    /// The ranks would run different jobs.
    #[error(
        "the ranks disagree on their {what}: from {least} to {most} (every rank must run the \
         same job, with as many devices)"
    )]
    RanksDisagree {
        /// What differs (`workers`, `parameters`...).
        what: &'static str,
        /// Its smallest value across the ranks.
        least: u64,
        /// Its largest.
        most: u64,
    },
    /// A pool without workers.
    #[error("the pool has no workers")]
    NoWorkers,
    /// A state whose optimiser state is not the optimiser's.
    #[error(
        "the training state's optimiser state ({state}) is not the optimiser's ({optimizer}), \
         each as long as the parameters"
    )]
    OtherOptimizerState {
        /// The state's vectors, by name.
        state: String,
        /// The optimiser's.
        optimizer: String,
    },
    /// A batch size of 0.
    #[error("the batch size must be at least 1")]
    EmptyBatch,
    /// An empty training set.
    #[error("the training set is empty")]
    NoExamples,
    /// A warm-up on one worker across ranks.
    #[error(
        "a warm-up on one worker is not implemented across ranks: train with a warm-up of 0 \
         epochs"
    )]
    WarmupAcrossRanks,
    /// An asynchronous run over a transport that carries no messages.
    #[error(
        "an asynchronous run across processes needs a transport with point-to-point messages \
         (its parameter service): this one has collectives only, so train with --sync"
    )]
    AsyncWithoutMessages,
    /// A staleness bound across ranks.
    #[error("a staleness bound ({0}) is not implemented across ranks: train with none")]
    BoundAcrossRanks(StalenessBound),
    /// A 16-bit exchange where no gradients travel between ranks or GPU replicas, or
    /// asynchronously.
    #[error(
        "--exchange {0} compresses the gradients a synchronous run sends between processes \
         (under mpirun) or between GPU replicas; this run {1}: train it with --exchange f32"
    )]
    ExchangeUnused(Exchange, &'static str),
}

/// Why a run could not finish.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// The state does not match the replicas' layout.
    #[error("the training state has {state} parameters but the model has {model}")]
    StateMismatch {
        /// Parameters in the state.
        state: usize,
        /// Parameters the replicas' layout describes.
        model: usize,
    },
    /// The configuration cannot run.
    #[error("invalid training configuration: {0}")]
    Config(#[from] ConfigError),
    /// A worker failed (synchronous: the run stopped, or the pool has a retired worker, without
    /// which lockstep training cannot run; asynchronous: every worker has failed, in this run or
    /// an earlier one on the same pool).
    #[error(transparent)]
    Worker(#[from] WorkerFailure),
    /// The parameters of record in device memory could not be set up or read back.
    #[error("the parameters of record on the device: {0}")]
    Device(ReplicaError),
}

/// A non-finite loss ends a run before its update is applied (the worker failure that carries
/// it names the step).
#[derive(Debug, thiserror::Error)]
#[error("the loss is {loss}: training diverged (try a smaller learning rate)")]
pub struct NonFiniteLoss {
    /// The loss.
    pub loss: f32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's examples over its seconds; a run too short to time counts as a nanosecond
    /// long rather than dividing by zero.
    #[test]
    fn examples_per_sec_divides_the_examples_by_the_run_s_seconds() {
        let report = |examples, elapsed| TrainReport {
            steps: 1,
            examples,
            elapsed,
            staleness: None,
            failures: Vec::new(),
            stopped: false,
        };
        assert_eq!(
            report(3000, Duration::from_millis(1500)).examples_per_sec(),
            2000.0
        );
        let instant = report(5, Duration::ZERO).examples_per_sec();
        assert!((instant / 5e9 - 1.0).abs() < 1e-12, "{instant}");
    }
}
